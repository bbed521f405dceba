"""Renames for HF DeepSeek-V2 / V3 (the hub layout `save_pretrained` writes): MLA under `self_attn.` with
`kv_a_proj_with_mqa`, `q_a_layernorm` / `kv_a_layernorm`; dense layers' `mlp.{gate,up,down}_proj`; MoE layers'
`mlp.gate` (router, V3 also `e_score_correction_bias`), `mlp.experts.N.*` and `mlp.shared_experts.*`.

DeepSeek rotates interleaved rope pairs; blazr rotates half-split. The rope rows of q (`q_proj` / `q_b_proj`:
the last R of each head's Dn + R rows) and of `kv_a_proj_with_mqa` (its last R rows, after the Lkv latent
rows) are permuted at load by `interleaved_to_half_rows`, which leaves q·k, and so the attention, unchanged
(a `RowOrder`: a GGUF's quantized rows move as stored).
"""

from __future__ import annotations

import re

from blazr.config import MLAConfig, ModelConfig
from blazr.loading.names import NameMap, RowOrder
from blazr.model.mla import interleaved_to_half_rows

L = r"layers\.(\d+)\."
HF = r"model.layers.\1."


def _mla_of(cfg: ModelConfig, m: re.Match[str]) -> MLAConfig:
    mla = cfg.layers[int(m.group(1))].mixer(MLAConfig)
    assert mla is not None, "an mla.* parameter belongs to an MLA layer"
    return mla


def deepseek_names(cfg: ModelConfig) -> NameMap:
    def q_rows(m: re.Match[str]) -> RowOrder | None:
        a = _mla_of(cfg, m)
        if not a.is_rope_interleaved:
            return None
        per_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        return RowOrder(
            lambda w: interleaved_to_half_rows(w, a.qk_rope_head_dim, per_head, a.qk_nope_head_dim)
        )

    def kv_a_rows(m: re.Match[str]) -> RowOrder | None:
        a = _mla_of(cfg, m)
        if not a.is_rope_interleaved:
            return None
        rows = a.kv_lora_rank + a.qk_rope_head_dim
        return RowOrder(lambda w: interleaved_to_half_rows(w, a.qk_rope_head_dim, rows, a.kv_lora_rank))

    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", HF + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", HF + "post_attention_layernorm.weight")
        .add(L + r"mla\.(q_proj|q_b_proj)\.weight", HF + r"self_attn.\2.weight", transform=q_rows)
        .add(L + r"mla\.q_a_proj\.weight", HF + "self_attn.q_a_proj.weight")
        .add(L + r"mla\.q_a_norm\.weight", HF + "self_attn.q_a_layernorm.weight")
        .add(L + r"mla\.kv_a_proj\.weight", HF + "self_attn.kv_a_proj_with_mqa.weight", transform=kv_a_rows)
        .add(L + r"mla\.kv_a_norm\.weight", HF + "self_attn.kv_a_layernorm.weight")
        .add(L + r"mla\.(kv_b_proj|o_proj)\.weight", HF + r"self_attn.\2.weight")
        .add(L + r"mlp\.(.+)", HF + r"mlp.\2")
        .add(L + r"moe\.router\.weight", HF + "mlp.gate.weight")
        .add(L + r"moe\.router\.correction_bias", HF + "mlp.gate.e_score_correction_bias")
        # per-expert tensors (hub layout), or the stacked [E, 2I, D] / [E, D, I] ones where a file has them
        .add(L + r"moe\.experts\.(.+)", HF + r"mlp.experts.\2")
        .add(L + r"moe\.shared\.(.+)", HF + r"mlp.shared_experts.\2")
    )


NAME_MAPS = {"DeepseekV2ForCausalLM": deepseek_names, "DeepseekV3ForCausalLM": deepseek_names}
