"""Renames for Kimi-Linear (`KimiLinearForCausalLM`) as its checkpoints are published (moonshotai's names,
which transformers renames at load and back at save): KDA and MLA both under `self_attn.` — KDA's q / k / v
projections and convs apart (`q_conv1d` …, blazr's fused qkv_proj / conv1d parts), `f_a_proj` / `f_b_proj`,
`g_a_proj` / `g_b_proj`, `b_proj`, `dt_bias`, `A_log` ([1, 1, H, 1], read as [H]), `o_norm`, `o_proj`; MLA as
DeepSeek's (NoPE: no rope rows to permute); the MoE under `block_sparse_moe.` (router `gate`, its
`e_score_correction_bias`, experts' `w1` / `w3` / `w2` = gate / up / down, `shared_experts`). The dense MLP
is `mlp.` in moonshotai's files and `block_sparse_moe.` in those transformers saves: either is read.
"""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
HF = r"model.layers.\1."
_EXPERT = {"gate": "w1", "up": "w3", "down": "w2"}


def kimi_linear_names(cfg: ModelConfig) -> NameMap:
    names = (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", HF + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", HF + "post_attention_layernorm.weight")
        .add(L + r"kda\.(.+)", HF + r"self_attn.\2")
        .add(L + r"mla\.q_a_norm\.weight", HF + "self_attn.q_a_layernorm.weight")
        .add(L + r"mla\.kv_a_proj\.weight", HF + "self_attn.kv_a_proj_with_mqa.weight")
        .add(L + r"mla\.kv_a_norm\.weight", HF + "self_attn.kv_a_layernorm.weight")
        .add(L + r"mla\.(.+)", HF + r"self_attn.\2")
        .add(L + r"mlp\.(.+)", HF + r"block_sparse_moe.\2", alternatives=(HF + r"mlp.\2",))
        .add(L + r"moe\.router\.weight", HF + "block_sparse_moe.gate.weight")
        .add(L + r"moe\.router\.correction_bias", HF + "block_sparse_moe.gate.e_score_correction_bias")
        .add(L + r"moe\.shared\.(.+)", HF + r"block_sparse_moe.shared_experts.\2")
    )
    for ours, theirs in _EXPERT.items():
        names.add(
            L + rf"moe\.experts\.(\d+)\.{ours}_proj\.weight",
            HF + rf"block_sparse_moe.experts.\2.{theirs}.weight",
        )
    return names


NAME_MAPS = {"KimiLinearForCausalLM": kimi_linear_names}
