"""Renames for HF Mixtral in its hub layout (what `save_pretrained` writes): Llama attention and norms, the
sparse block under `block_sparse_moe.` with the router as `gate` and each expert's SwiGLU as `w1` (gate),
`w3` (up), `w2` (down). blazr stacks the experts at load (`unfuse`)."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
HF = r"model.layers.\1."


def mixtral_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", HF + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", HF + "post_attention_layernorm.weight")
        .add(L + r"attn\.(.+)", HF + r"self_attn.\2")
        .add(L + r"moe\.router\.weight", HF + "block_sparse_moe.gate.weight")
        .add(L + r"moe\.experts\.(\d+)\.gate_proj\.weight", HF + r"block_sparse_moe.experts.\2.w1.weight")
        .add(L + r"moe\.experts\.(\d+)\.up_proj\.weight", HF + r"block_sparse_moe.experts.\2.w3.weight")
        .add(L + r"moe\.experts\.(\d+)\.down_proj\.weight", HF + r"block_sparse_moe.experts.\2.w2.weight")
    )


NAME_MAPS = {"MixtralForCausalLM": mixtral_names}
