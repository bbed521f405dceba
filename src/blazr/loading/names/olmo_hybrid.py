"""Renames for OLMo-Hybrid (`OlmoHybridForCausalLM`) as its checkpoints are published (OLMo-core's names,
which transformers renames at load): gated DeltaNet under `linear_attn.` with its own q / k / v / g (blazr's
z) / b / a projections, one conv per q, k and v (`q_conv1d` …, blazr's conv1d parts), `o_proj` and `o_norm`;
attention under `self_attn.`; the DeltaNet blocks' pre-norms (`attention_layer_norm`,
`feedforward_layer_norm`) and the attention blocks' post-norms (`feedforward_layer_norm` after the
attention, `post_feedforward_layernorm` after the MLP). (A checkpoint saved in transformers' own names,
`save_original_format=False`, is refused: its norms are missing under these names.)"""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def olmo_hybrid_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "attention_layer_norm.weight")
        .add(L + r"(?:ffn_norm|mixer_post_norm)\.weight", M + "feedforward_layer_norm.weight")
        .add(L + r"ffn_post_norm\.weight", M + "post_feedforward_layernorm.weight")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"deltanet\.z_proj\.weight", M + "linear_attn.g_proj.weight")
        .add(L + r"deltanet\.out_proj\.weight", M + "linear_attn.o_proj.weight")
        .add(L + r"deltanet\.norm\.weight", M + "linear_attn.o_norm.weight")
        .add(L + r"deltanet\.(.+)", M + r"linear_attn.\2")
        .add(L + r"mlp\.(.+)", M + r"mlp.\2")
    )


NAME_MAPS = {"OlmoHybridForCausalLM": olmo_hybrid_names}
