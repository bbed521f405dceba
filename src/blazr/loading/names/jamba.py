"""Renames for HF `JambaForCausalLM`: the Mamba1 mixer under `mamba.` (its leaves as loading/names/mamba1.py
maps them), NoPE attention under `self_attn.`, norms `input_layernorm` / `pre_ff_layernorm` and the final
`final_layernorm`; the feed-forward `feed_forward.{gate,up,down}_proj`, or the MoE's `router` and
per-expert `experts.N.{gate,up,down}_proj` (stacked at load), or transformers' fused 3-D
`experts.gate_up_proj` / `down_proj`."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap
from blazr.loading.names.mamba1 import add_mamba1_mixer

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def jamba_names(cfg: ModelConfig) -> NameMap:
    names = (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.final_layernorm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "pre_ff_layernorm.weight")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"mlp\.(.+)", M + r"feed_forward.\2")
        .add(L + r"moe\.router\.weight", M + "feed_forward.router.weight")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"feed_forward.experts.\2")
        .add(L + r"moe\.experts\.(\d+)\.(.+)", M + r"feed_forward.experts.\2.\3")
    )
    return add_mamba1_mixer(names, M, "mamba.")


NAME_MAPS = {"JambaForCausalLM": jamba_names}
