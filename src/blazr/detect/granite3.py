"""Granite 3 dense (`GraniteForCausalLM`) and MoE (`GraniteMoeForCausalLM`, `GraniteMoeSharedForCausalLM`)
detection: Llama's attention (rope, GQA) with the µP scalars — `embedding_multiplier` (the embedding output),
`residual_multiplier` (each block's output before its residual add), `attention_multiplier` (the softmax
scale, in place of 1/√Dh) and `logits_scaling` (logits divided by it) — then a SwiGLU MLP (dense) or routed
experts stored fused and 3-D (`block_sparse_moe.input_linear` [E, 2I, D] gate rows first, `output_linear`
[E, D, I], router `router.layer` [E, D]; top-k over the router logits, softmax over the k — a softmax then
renormalised over the k), plus an always-on `shared_mlp` where the checkpoint holds one (GraniteMoeShared).

Config.json is needed for the multipliers (no shape carries them: without it they take transformers'
defaults, 1); sizes come from it or the shapes.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

DENSE, MOE, SHARED = "GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"
PREFIX = "model."


def _ffn(raw: Raw, shapes: Shapes, p: str, arch: str) -> dict[str, MLPConfig | MoEConfig]:
    """The feed-forward of the layer under `p` (`model.layers.i.`)."""
    act = activation(raw.get("hidden_act", "silu"))
    if arch == DENSE:
        gate = shapes.get(p + "mlp.gate_proj.weight")
        size = need(
            raw.int("intermediate_size", gate[0] if gate else None),
            "intermediate_size",
            f"{p}mlp.gate_proj.weight is missing",
        )
        return {"mlp": MLPConfig(intermediate_size=size, activation=act)}
    experts = require(shapes, p + "block_sparse_moe.input_linear.weight")  # [E, 2I, D]
    num_experts = raw.int("num_local_experts", experts[0])
    if experts[0] != num_experts:
        raise CheckpointError(
            f"tensor {p}block_sparse_moe.input_linear.weight: expected {num_experts} experts "
            f"(num_local_experts), found {list(experts)}"
        )
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        top_k = min(2, num_experts)
        log.warning("num_experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    shared = shapes.get(p + "shared_mlp.input_linear.weight")  # [2·I_shared, D]: gate rows, then up rows
    return {
        "moe": MoEConfig(
            num_experts=num_experts,
            top_k=top_k,
            expert=MLPConfig(intermediate_size=experts[1] // 2, activation=act),
            scoring="softmax",
            is_renormalized=True,
            shared=MLPConfig(intermediate_size=shared[0] // 2, activation=act) if shared else None,
        )
    }


def build_granite3(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    prefix = PREFIX + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, prefix)))
    if not num_layers:
        raise CheckpointError(f"no {prefix}N.* tensors found")
    max_pos = raw.int("max_position_embeddings", 2048 if arch == DENSE else 4096)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    attention = llama_attention(raw, shapes, f"{prefix}0.self_attn.", hidden, max_pos)
    attention = replace(attention, softmax_scale=raw.float("attention_multiplier", 1.0))
    layers = tuple(
        LayerConfig(mixers=(attention,), norm=norm, ffn_norm=norm, **_ffn(raw, shapes, f"{prefix}{i}.", arch))
        for i in range(num_layers)
    )
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
        embedding_multiplier=raw.float("embedding_multiplier", 1.0),
        residual_multiplier=raw.float("residual_multiplier", 1.0),
        logits_scale=1.0 / raw.float("logits_scaling", 1.0),
    )


ARCHES = (DENSE, MOE, SHARED)
BUILDERS = {arch: (lambda raw, shapes, a=arch: build_granite3(raw, shapes, a)) for arch in ARCHES}
MODEL_TYPES = {"granite": DENSE, "granitemoe": MOE, "granitemoeshared": SHARED}
