"""HF `BambaForCausalLM` detection: each layer holds a Mamba2 mixer (`mamba.`) or GQA attention
(`self_attn.`, RoPE over the first half of each head: transformers hard-codes partial_rotary_factor 0.5
unless `rope_parameters` names one), then a SwiGLU `feed_forward`; norms `input_layernorm`,
`pre_ff_layernorm`, final `final_layernorm`.

Layer kinds: `attn_layer_indices` (the attention layers; the rest are Mamba2), else `layer_types` /
`layers_block_type` in legacy or v5 names, else which of `mamba.` / `self_attn.` each layer holds. Without
config.json, what no shape carries takes transformers' defaults (rope θ 10000, eps 1e-5, n_groups 1,
chunk 256, no dt limit; heads from the common head size that divides the projections).
"""

from __future__ import annotations

from blazr.config import LayerConfig, MixerConfig, MLPConfig, ModelConfig, NormConfig, RopeConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import (
    Kind,
    attention_config,
    check_silu,
    is_tied,
    layer_kinds_from_list,
    layers_with,
    mamba_or_attention,
    num_layers_of,
    prefixed_mamba_config,
    require,
)
from blazr.errors import CheckpointError

ARCH = "BambaForCausalLM"
PREFIX = "model."


def _layer_kinds(raw: Raw, shapes: Shapes, num_layers: int) -> list[Kind]:
    indices = raw.get("attn_layer_indices")
    if indices is not None:
        if not isinstance(indices, list) or any(
            not isinstance(i, int) or not 0 <= i < num_layers for i in indices
        ):
            raise CheckpointError(
                f"{raw.path}: attn_layer_indices must list indices below {num_layers}, found {indices!r}"
            )
        return ["attention" if i in indices else "mamba" for i in range(num_layers)]
    kinds = layer_kinds_from_list(raw, ("layer_types", "layers_block_type"), num_layers)
    return kinds or mamba_or_attention(shapes, PREFIX + "layers.", num_layers)


def partial_rotary_factor(raw: Raw) -> float:
    params = raw.get("rope_parameters") or {}
    value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    return 0.5 if value is None else float(value)


def build_bamba(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    kinds = _layer_kinds(raw, shapes, num_layers)
    if any(k not in ("mamba", "attention") for k in kinds):
        raise CheckpointError(f"{raw.path}: Bamba layer types must be mamba or attention, found {kinds}")
    max_pos = raw.int("max_position_embeddings", 262144)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    rotary = partial_rotary_factor(raw)

    def rope(head_dim: int) -> RopeConfig:
        return rope_from_raw(raw, int(head_dim * rotary), max_pos)

    if "mamba" in kinds:
        check_silu(raw, "hidden_act")
    act = activation(raw.get("hidden_act", "silu"))
    layers = []
    for i, kind in enumerate(kinds):
        p = f"{PREFIX}layers.{i}."
        if kind == "mamba":
            mixer: MixerConfig = prefixed_mamba_config(raw, shapes, p + "mamba.", norm.eps)
        else:
            mixer = attention_config(raw, shapes, p + "self_attn.", rope)
        mlp = MLPConfig(
            intermediate_size=require(shapes, p + "feed_forward.gate_proj.weight")[0],
            activation=act,
            has_bias=p + "feed_forward.gate_proj.bias" in shapes,
        )
        layers.append(LayerConfig(mixers=(mixer,), norm=norm, ffn_norm=norm, mlp=mlp))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_bamba(shapes: Shapes) -> bool:
    """Mamba2 layers (`mamba.dt_bias`) beside a `feed_forward`, never sharing a layer with attention (that
    is FalconH1)."""
    layers = PREFIX + "layers."
    mamba = layers_with(shapes, layers, "mamba.dt_bias")
    return (
        bool(mamba)
        and bool(layers_with(shapes, layers, "feed_forward."))
        and not mamba & layers_with(shapes, layers, "self_attn.")
    )


BUILDERS = {ARCH: build_bamba}
MODEL_TYPES = {"bamba": ARCH}
NAME_RULES = [(_is_bamba, ARCH)]
