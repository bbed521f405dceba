"""OLMo 2 (`Olmo2ForCausalLM`) and OLMo 3 (`Olmo3ForCausalLM`) detection: post-norm blocks (the attention's
and the MLP's outputs RMS-normed before their residual adds — `post_attention_layernorm`,
`post_feedforward_layernorm` — and no norm before them), GQA attention with a q/k RMSNorm over all heads'
features (`q_norm` [H·Dh], `k_norm` [Hkv·Dh]) before rope, a SwiGLU MLP.

OLMo 3 adds sliding-window layers (`layer_types`: "sliding_attention" / "full_attention"; by default every
4th layer is full) and a rope per layer type (v5 `rope_parameters` keyed by layer type; a v4 config's
`rope_scaling` applies to the full-attention layers only, its `rope_theta` to both — as transformers and
llama.cpp read them). A sliding layer's cache holds only its window (state/layout.py KV groups).

Without config.json the names say OLMo 2 (OLMo 3's tensors are the same: its windows need config.json);
sizes from shapes, the head size by the common sizes that divide q_proj / k_proj (a warning); what no shape
carries takes transformers' defaults (rope θ 10000, RMSNorm eps 1e-5).
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError

OLMO2, OLMO3 = "Olmo2ForCausalLM", "Olmo3ForCausalLM"
PREFIX = "model."
_OLMO3_THETA = 500000.0  # Olmo3Config's default_theta


def _layer_types(raw: Raw, arch: str, num_layers: int) -> list[str]:
    if arch == OLMO2:
        return ["full_attention"] * num_layers
    kinds = raw.get("layer_types")
    if kinds is None:
        return ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise CheckpointError(f"{raw.path}: layer_types must list {num_layers} layer types, found {kinds!r}")
    if any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise CheckpointError(
            f"{raw.path}: layer_types must be sliding_attention or full_attention, found {kinds}"
        )
    return list(kinds)


def _rope_raw(raw: Raw, arch: str, kind: str) -> Raw:
    """The config keys the rope of a layer of type `kind` reads (OLMo 3: one rope per layer type)."""
    if arch == OLMO2:
        return raw
    params = raw.get("rope_parameters")
    data = {k: v for k, v in raw.data.items() if k not in ("rope_parameters", "rope_scaling")}
    data.setdefault("rope_theta", _OLMO3_THETA)
    if isinstance(params, dict) and kind in params:  # v5: keyed by layer type
        return Raw({**data, "rope_parameters": params[kind]}, raw.path)
    if isinstance(params, dict) and params:  # one set for every layer
        return Raw({**data, "rope_parameters": params}, raw.path)
    scaling = raw.get("rope_scaling") if kind == "full_attention" else None  # v4
    return Raw({**data, "rope_scaling": scaling}, raw.path)


def build_olmo2(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    prefix = PREFIX + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, prefix)))
    if not num_layers:
        raise CheckpointError(f"no {prefix}N.* tensors found")
    max_pos = raw.int("max_position_embeddings", 4096 if arch == OLMO2 else 65536)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    gate = shapes.get(prefix + "0.mlp.gate_proj.weight")
    mlp = MLPConfig(
        intermediate_size=need(
            raw.int("intermediate_size", gate[0] if gate else None),
            "intermediate_size",
            f"{prefix}0.mlp.gate_proj.weight is missing",
        ),
        activation=activation(raw.get("hidden_act", "silu")),
    )
    window = raw.int("sliding_window", 4096)
    layers = []
    for i, kind in enumerate(_layer_types(raw, arch, num_layers)):
        attn = f"{prefix}{i}.self_attn."
        is_sliding = kind == "sliding_attention"
        attention = llama_attention(
            _rope_raw(raw, arch, kind), shapes, attn, hidden, max_pos, window if is_sliding else None
        )
        attention = replace(attention, qk_norm=norm, is_qk_norm_per_head=False)
        for x, heads in (("q", attention.num_heads), ("k", attention.num_kv_heads)):
            found, width = require(shapes, f"{attn}{x}_norm.weight"), heads * attention.head_dim
            if found[0] != width:
                raise CheckpointError(
                    f"tensor {attn}{x}_norm.weight: expected [{width}] (all {heads} heads of "
                    f"{attention.head_dim}), found {list(found)}"
                )
        layers.append(
            LayerConfig(
                mixers=(attention,), mlp=mlp, norm=None, ffn_norm=None, post_norm=norm, ffn_post_norm=norm
            )
        )
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_olmo2(shapes: Shapes) -> bool:
    """Post-norm attention blocks (`post_feedforward_layernorm`, no `input_layernorm`) with q/k norms."""
    names = list(shapes)
    return (
        any(n.endswith(".post_feedforward_layernorm.weight") for n in names)
        and any(n.endswith(".self_attn.q_norm.weight") for n in names)
        and not any(n.endswith(".input_layernorm.weight") or ".linear_attn." in n for n in names)
    )


BUILDERS = {arch: (lambda raw, shapes, a=arch: build_olmo2(raw, shapes, a)) for arch in (OLMO2, OLMO3)}
MODEL_TYPES = {"olmo2": OLMO2, "olmo3": OLMO3}
NAME_RULES = [(_is_olmo2, OLMO2)]
