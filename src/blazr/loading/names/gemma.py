"""Renames for HF Gemma 2 / Gemma 3 text (and the language model of Gemma3ForConditionalGeneration, under
`language_model.model.`; its vision tower and projector left unread):
Llama's attention and MLP names (Gemma 3's q/k norms under `self_attn.q_norm` / `k_norm`) and the sandwich
norms — `input_layernorm` / `post_attention_layernorm` around the attention, `pre_feedforward_layernorm` /
`post_feedforward_layernorm` around the MLP."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."


def gemma_names(cfg: ModelConfig, prefix: str = "model.", head: str = "lm_head.weight") -> NameMap:
    M = prefix + r"layers.\1."
    return (
        NameMap()
        .add(r"embed_tokens\.weight", prefix + "embed_tokens.weight")
        .add(r"norm\.weight", prefix + "norm.weight")
        .add(r"lm_head\.weight", head)
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"mixer_post_norm\.weight", M + "post_attention_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "pre_feedforward_layernorm.weight")
        .add(L + r"ffn_post_norm\.weight", M + "post_feedforward_layernorm.weight")
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        .add(L + r"mlp\.(.+)", M + r"mlp.\2")
    )


NAME_MAPS = {
    "Gemma2ForCausalLM": gemma_names,
    "Gemma3ForCausalLM": gemma_names,
    "Gemma3ForConditionalGeneration": lambda cfg: gemma_names(
        cfg, "language_model.model.", "language_model.lm_head.weight"
    ).ignore("vision_tower.", "multi_modal_projector."),
}
