"""Renames for HF OLMo 2 / OLMo 3: Llama's attention and MLP names (the q/k norms under `self_attn.q_norm` /
`k_norm`) and the post-norms — `post_attention_layernorm` on the attention's output, `post_feedforward_
layernorm` on the MLP's; no pre-norms."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def olmo2_names(cfg: ModelConfig) -> NameMap:
    return (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_post_norm\.weight", M + "post_attention_layernorm.weight")
        .add(L + r"ffn_post_norm\.weight", M + "post_feedforward_layernorm.weight")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"mlp\.(.+)", M + r"mlp.\2")
    )


NAME_MAPS = {"Olmo2ForCausalLM": olmo2_names, "Olmo3ForCausalLM": olmo2_names}
