"""Mixtral detection: GQA attention (Mistral's, with an optional sliding window) + a routed MoE in every
layer (softmax → top-k → renormalise, no shared expert), from HF config keys (transformers v4 `rope_theta`
or v5 `rope_parameters`) or from tensor shapes alone.

Shapes give vocab, hidden, layers, experts (router rows), expert width and, through `guess_head_dim`, the
heads. What no shape carries takes Mixtral's own defaults: 2 experts per token, rope θ 1e6, RMSNorm eps
1e-5, 32768 positions, no sliding window.
"""

from __future__ import annotations

import logging

from blazr.config import AttentionConfig, LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, guess_head_dim, layer_indices, need, rope_from_raw, shape_of
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

ARCH = "MixtralForCausalLM"
_PREFIX = "model.layers."
_MOE = "block_sparse_moe."
_DEFAULT_THETA = 1e6
_DEFAULT_TOP_K = 2


def _require(shapes: Shapes, name: str) -> tuple[int, ...]:
    shape = shape_of(shapes, name)
    if shape is None:
        raise CheckpointError(f"missing tensor {name}")
    return shape


def _attention(raw: Raw, shapes: Shapes, hidden: int, max_pos: int) -> AttentionConfig:
    attn = f"{_PREFIX}0.self_attn."
    num_heads, head_dim = raw.int("num_attention_heads"), raw.int("head_dim")
    if num_heads is None and head_dim is None:
        q, k = _require(shapes, attn + "q_proj.weight"), _require(shapes, attn + "k_proj.weight")
        head_dim = guess_head_dim(q[0], k[0])
        log.warning(
            "num_attention_heads is not in config.json; assuming head_dim %d (%d heads)",
            head_dim,
            q[0] // head_dim,
        )
    if head_dim is None:
        head_dim = hidden // num_heads
    if num_heads is None:
        num_heads = _require(shapes, attn + "q_proj.weight")[0] // head_dim
    num_kv_heads = raw.int("num_key_value_heads")
    if num_kv_heads is None:
        num_kv_heads = _require(shapes, attn + "k_proj.weight")[0] // head_dim
    # Mixtral's rope θ is 1e6; only a config that names none (or no config.json) falls back to it
    rope_raw = Raw({**raw.data, "rope_theta": raw.get("rope_theta", _DEFAULT_THETA)}, raw.path)
    return AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=rope_from_raw(rope_raw, head_dim, max_pos),
        softmax_scale=head_dim**-0.5,
        sliding_window=raw.int("sliding_window"),
    )


def _moe(raw: Raw, shapes: Shapes) -> MoEConfig:
    moe = f"{_PREFIX}0.{_MOE}"
    num_experts = raw.int("num_local_experts")
    if num_experts is None:
        num_experts = _require(shapes, moe + "gate.weight")[0]
    intermediate = raw.int("intermediate_size")
    if intermediate is None:
        intermediate = _require(shapes, moe + "experts.0.w1.weight")[0]
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        top_k = min(_DEFAULT_TOP_K, num_experts)
        log.warning("num_experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    expert = MLPConfig(intermediate_size=intermediate, activation=activation(raw.get("hidden_act", "silu")))
    return MoEConfig(num_experts=num_experts, top_k=top_k, expert=expert, scoring="softmax")


def build_mixtral(raw: Raw, shapes: Shapes) -> ModelConfig:
    embed = _require(shapes, "model.embed_tokens.weight")
    vocab, hidden = raw.int("vocab_size", embed[0]), raw.int("hidden_size", embed[1])
    num_layers = need(
        raw.int("num_hidden_layers") or len(layer_indices(shapes, _PREFIX)) or None,
        "num_hidden_layers",
        f"no {_PREFIX}N.* tensors were found",
    )
    max_pos = raw.int("max_position_embeddings", 32768)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    layer = LayerConfig(
        mixers=(_attention(raw, shapes, hidden, max_pos),), moe=_moe(raw, shapes), norm=norm, ffn_norm=norm
    )
    tied = raw.get("tie_word_embeddings")
    if tied is None:
        tied = "lm_head.weight" not in shapes
    return ModelConfig(
        architecture=ARCH,
        vocab_size=vocab,
        hidden_size=hidden,
        layers=(layer,) * num_layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(tied),
    )


BUILDERS = {ARCH: build_mixtral}
MODEL_TYPES = {"mixtral": ARCH}
# Mixtral's per-expert `block_sparse_moe.experts.N.w1` (Granite's block_sparse_moe has fused `input_linear`)
NAME_RULES = [
    (lambda shapes: any(f".{_MOE}experts." in n and n.endswith(".w1.weight") for n in shapes), ARCH)
]
