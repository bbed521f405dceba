"""Renames for oxidizr checkpoints (spec §3): no `model.` prefix; Mamba2 blocks under `mamba2.` with the
block norm beside the mixer; MLA as separate w_* projections (split logical parts, see `unfuse`); MoE with
`router.gate`, per-expert SwiGLU and an always-on `shared_expert`."""

from __future__ import annotations

from blazr.config import Mamba2Config, ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."


def oxidizr_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "embed_tokens.weight")
        .add(r"norm\.weight", "norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        # Mamba2 blocks: LayerNorm(+bias) before the mixer
        .add(L + r"mixer_norm\.(weight|bias)", r"layers.\1.mamba2.norm.\2", only_if=_is_mamba(cfg))
        .add(L + r"mamba\.(.+)", r"layers.\1.mamba2.mixer.\2")
        # attention blocks
        .add(L + r"mixer_norm\.weight", r"layers.\1.input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", r"layers.\1.post_attention_layernorm.weight")
        .add(L + r"attn\.(.+)", r"layers.\1.self_attn.\2")
        .add(L + r"mla\.q_a_proj\.weight", r"layers.\1.self_attn.w_dq.weight")
        .add(L + r"mla\.q_b_proj\.weight", r"layers.\1.self_attn.w_uq.weight")
        .add(L + r"mla\.q_rope_proj\.weight", r"layers.\1.self_attn.w_qr.weight")
        .add(L + r"mla\.kv_a_proj\.latent", r"layers.\1.self_attn.w_dkv.weight")
        .add(L + r"mla\.kv_a_proj\.rope", r"layers.\1.self_attn.w_kr.weight")
        .add(L + r"mla\.kv_b_proj\.k", r"layers.\1.self_attn.w_uk.weight")
        .add(L + r"mla\.kv_b_proj\.v", r"layers.\1.self_attn.w_uv.weight")
        .add(L + r"mla\.o_proj\.weight", r"layers.\1.self_attn.o_proj.weight")
        .add(L + r"mlp\.(.+)", r"layers.\1.mlp.\2")
        .add(L + r"moe\.router\.weight", r"layers.\1.moe.router.gate.weight")
        .add(L + r"moe\.experts\.(.+)", r"layers.\1.moe.experts.\2")
        .add(L + r"moe\.shared\.(.+)", r"layers.\1.moe.shared_expert.\2")
    )


def _is_mamba(cfg: ModelConfig):
    return lambda m: cfg.layers[int(m.group(1))].mixer(Mamba2Config) is not None


NAME_MAPS = {"oxidizr": oxidizr_names}
