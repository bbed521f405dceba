"""Renames for HF Gemma 4 text (`Gemma4ForCausalLM`, and the language model of
`Gemma4ForConditionalGeneration` under `model.language_model.`; its vision / audio towers and embedders left
unread): Gemma 3's sandwich norms and attention names (loading/names/gemma.py) — a shared-KV layer's
qkv_proj has q_proj only, a K = V layer's q_proj and k_proj — plus the per-layer inputs (model:
`embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`; each layer:
`per_layer_input_gate`, `per_layer_projection`, `post_per_layer_input_norm`), each layer's
`layer_scalar`, and the MoE layers' router (`router.proj`, `.scale`, `.per_expert_scale`), 3-D experts
(`experts.gate_up_proj`, `experts.down_proj`) and their norms (`pre_feedforward_layernorm_2`,
`post_feedforward_layernorm_1` / `_2`)."""

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
        .add(L + r"mlp_post_norm\.weight", M + "post_feedforward_layernorm_1.weight")
        .add(L + r"moe_post_norm\.weight", M + "post_feedforward_layernorm_2.weight")
        .add(L + r"moe\.norm\.weight", M + "pre_feedforward_layernorm_2.weight")
        .add(L + r"moe\.router\.weight", M + "router.proj.weight")
        .add(L + r"moe\.router\.input_scale", M + "router.scale")
        .add(L + r"moe\.router\.expert_scale", M + "router.per_expert_scale")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"experts.\2")
    )


NAME_MAPS = {
    "Gemma4ForCausalLM": gemma4_names,
    "Gemma4ForConditionalGeneration": lambda cfg: gemma4_names(cfg, "model.language_model.").ignore(
        "model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."
    ),
}
