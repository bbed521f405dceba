"""Renames for HF Gemma 4 text (`Gemma4ForCausalLM`, and the language model of
`Gemma4ForConditionalGeneration` under `model.language_model.`; its vision / audio towers and embedders left
unread): Gemma 3's sandwich norms and attention names (loading/names/gemma.py) — a shared-KV layer's
qkv_proj has q_proj only, a K = V layer's q_proj and k_proj — plus the per-layer inputs (model:
`embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`; each layer:
`per_layer_input_gate`, `per_layer_projection`, `post_per_layer_input_norm`) and each layer's
`layer_scalar`."""

from __future__ import annotations

from blazr.config import ModelConfig
from blazr.loading.names import NameMap
from blazr.loading.names.gemma import gemma_names

L = r"layers\.(\d+)\."


def gemma4_names(cfg: ModelConfig, prefix: str = "model.", head: str = "lm_head.weight") -> NameMap:
    M = prefix + r"layers.\1."
    return (
        gemma_names(cfg, prefix, head)
        .add(r"per_layer_inputs\.embed\.weight", prefix + "embed_tokens_per_layer.weight")
        .add(r"per_layer_inputs\.proj\.weight", prefix + "per_layer_model_projection.weight")
        .add(r"per_layer_inputs\.norm\.weight", prefix + "per_layer_projection_norm.weight")
        .add(L + r"per_layer\.gate\.weight", M + "per_layer_input_gate.weight")
        .add(L + r"per_layer\.proj\.weight", M + "per_layer_projection.weight")
        .add(L + r"per_layer\.post_norm\.weight", M + "post_per_layer_input_norm.weight")
        .add(L + r"out_scale", M + "layer_scalar")
    )


NAME_MAPS = {
    "Gemma4ForCausalLM": gemma4_names,
    "Gemma4ForConditionalGeneration": lambda cfg: gemma4_names(cfg, "model.language_model.").ignore(
        "model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."
    ),
}
