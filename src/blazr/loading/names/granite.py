"""Renames for HF `GraniteMoeHybridForCausalLM` (Granite 4.0-H): Mamba2 under `mamba.`, attention under
`self_attn.`; the routed experts stored fused and 3-D (`block_sparse_moe.input_linear.weight` [E, 2I, D] with
gate rows first, `output_linear.weight` [E, D, I], router `router.layer.weight`), loaded whole into blazr's
stacked expert tensors; the shared MLP (`shared_mlp.input_linear` [2I, D], gate rows first) is the MoE's
shared MLP, or the layer's dense MLP when the model has no experts."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def granite_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "post_attention_layernorm.weight")
        .add(L + r"mamba\.(.+)", M + r"mamba.\2")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"moe\.router\.weight", M + "block_sparse_moe.router.layer.weight")
        .add(L + r"moe\.experts\.gate_up_proj", M + "block_sparse_moe.input_linear.weight")
        .add(L + r"moe\.experts\.down_proj", M + "block_sparse_moe.output_linear.weight")
        .add(L + r"(?:moe\.shared|mlp)\.gate_up_proj\.weight", M + "shared_mlp.input_linear.weight")
        .add(L + r"(?:moe\.shared|mlp)\.down_proj\.weight", M + "shared_mlp.output_linear.weight")
    )


NAME_MAPS = {"GraniteMoeHybridForCausalLM": granite_names}
