"""Renames for HF `BambaForCausalLM`: Mamba2 under `mamba.`, attention under `self_attn.`, the SwiGLU under
`feed_forward.`, norms `input_layernorm` / `pre_ff_layernorm`, final `final_layernorm`."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def bamba_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.final_layernorm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "pre_ff_layernorm.weight")
        .add(L + r"mamba\.(.+)", M + r"mamba.\2")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"mlp\.(.+)", M + r"feed_forward.\2")
    )


NAME_MAPS = {"BambaForCausalLM": bamba_names}
