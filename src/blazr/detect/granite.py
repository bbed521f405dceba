"""HF `GraniteMoeHybridForCausalLM` (Granite 4.0-H) detection: each layer holds a Mamba2 mixer or GQA
attention (NoPE unless `position_embedding_type` is "rope"), then a MoE of softmax-top-k SwiGLU experts plus
an always-on shared MLP (`block_sparse_moe.*` + `shared_mlp.*`), or only the shared MLP when
`num_local_experts` is 0. µP scalars: `embedding_multiplier`, `residual_multiplier`, `logits_scaling`
(logits are divided by it) become ModelConfig scalars; `attention_multiplier` is the softmax scale.

Layer kinds: `layer_types` / `layers_block_type` in legacy ("mamba" / "attention") or v5
("linear_attention" / "full_attention") names, else which of `mamba.` / `self_attn.` each layer holds.
Without config.json, what no shape carries takes transformers' defaults: multipliers 1, NoPE, rope θ 10000,
RMSNorm eps 1e-6, top-2 routing, n_groups 1, chunk 256, no dt limit; attention heads assume the common
head size that divides the projections.
"""

from __future__ import annotations

import logging

from blazr.config import LayerConfig, MixerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig, RopeConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import (
    attention_config,
    check_silu,
    is_tied,
    layer_kinds_from_list,
    mamba_or_attention,
    num_layers_of,
    prefixed_mamba_config,
    require,
)
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

ARCH = "GraniteMoeHybridForCausalLM"
PREFIX = "model."


def _ffn(raw: Raw, shapes: Shapes, i: int) -> dict[str, MLPConfig | MoEConfig]:
    p = f"{PREFIX}layers.{i}."
    act = activation(raw.get("hidden_act", "silu"))
    shared = None
    if p + "shared_mlp.input_linear.weight" in shapes:
        rows = shapes[p + "shared_mlp.input_linear.weight"][0]  # [2·I_shared, D]: gate rows, then up rows
        shared = MLPConfig(intermediate_size=rows // 2, activation=act)
    num_experts = raw.int("num_local_experts")
    if num_experts is None:
        router = shapes.get(p + "block_sparse_moe.router.layer.weight")
        num_experts = router[0] if router else 0
    if num_experts == 0:
        if shared is None:
            raise CheckpointError(f"layer {i}: no experts and no {p}shared_mlp.input_linear.weight")
        return {"mlp": shared}
    experts = require(shapes, p + "block_sparse_moe.input_linear.weight")  # [E, 2I, D]
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        top_k = min(2, num_experts)
        log.warning("num_experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    moe = MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        expert=MLPConfig(intermediate_size=experts[1] // 2, activation=act),
        scoring="softmax",
        is_renormalized=True,  # softmax over the top-k logits == softmax, then renormalise over k
        shared=shared,
    )
    return {"moe": moe}


def build_granite(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    kinds = layer_kinds_from_list(raw, ("layer_types", "layers_block_type"), num_layers)
    kinds = kinds or mamba_or_attention(shapes, PREFIX + "layers.", num_layers)
    if any(k not in ("mamba", "attention") for k in kinds):
        raise CheckpointError(f"{raw.path}: Granite layer types must be mamba or attention, found {kinds}")
    max_pos = raw.int("max_position_embeddings", 2048)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    is_rope = raw.get("position_embedding_type") == "rope"

    def rope(head_dim: int) -> RopeConfig | None:
        return rope_from_raw(raw, head_dim, max_pos) if is_rope else None

    if "mamba" in kinds:
        check_silu(raw, "hidden_act")
    layers = []
    for i, kind in enumerate(kinds):
        p = f"{PREFIX}layers.{i}."
        if kind == "mamba":
            mixer: MixerConfig = prefixed_mamba_config(raw, shapes, p + "mamba.", norm.eps)
        else:
            scale = raw.float("attention_multiplier", 1.0)
            mixer = attention_config(raw, shapes, p + "self_attn.", rope, scale)
        layers.append(LayerConfig(mixers=(mixer,), norm=norm, ffn_norm=norm, **_ffn(raw, shapes, i)))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
        embedding_multiplier=raw.float("embedding_multiplier", 1.0),
        residual_multiplier=raw.float("residual_multiplier", 1.0),
        logits_scale=1.0 / raw.float("logits_scaling", 1.0),
    )


def _is_granite(shapes: Shapes) -> bool:
    return any(".block_sparse_moe.input_linear." in n or ".shared_mlp.input_linear." in n for n in shapes)


BUILDERS = {ARCH: build_granite}
MODEL_TYPES = {"granitemoehybrid": ARCH}
NAME_RULES = [(_is_granite, ARCH)]
