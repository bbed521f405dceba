"""HF `FalconH1ForCausalLM` detection: every layer runs GQA attention (RoPE) and a Mamba2 mixer in parallel
on the same normed input and sums them, then a SwiGLU `feed_forward`; norms `input_layernorm`,
`pre_ff_layernorm`, final `final_layernorm`. The Mamba2 inner width may differ from expand·hidden
(`mamba_d_ssm`); its gated RMSNorm is optional (`mamba_rms_norm`; without it the output is y·silu(z)) and
normalises before the gate by default (`mamba_norm_before_gate`).

µP multipliers (modeling_falcon_h1.py), all exact to fold:
- embedding_multiplier → `ModelConfig.embedding_multiplier`; lm_head_multiplier → `logits_scale`;
- per weight, folded at load (loading/names/falcon_h1.py) from `FalconH1Multipliers`:
  attention_in_multiplier (the attention's input: q/k/v weights), key_multiplier (k weight and bias),
  attention_out_multiplier (o_proj), ssm_in_multiplier (in_proj input columns), ssm_multipliers (the five
  row segments z | x | B | C | dt of in_proj — transformers' `mup_vector`), ssm_out_multiplier (out_proj),
  mlp_multipliers (gate_proj, down_proj).
They travel in `FalconH1ModelConfig`, a ModelConfig with one more field, since a name map sees only the
config. Without config.json the multipliers (and rope θ 10000, eps 1e-5, n_groups 1, chunk 256, norm before
gate) take transformers' defaults; heads assume the common head size that divides the projections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blazr.config import LayerConfig, MLPConfig, ModelConfig, NormConfig, RopeConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import (
    attention_config,
    check_silu,
    is_tied,
    layers_with,
    num_layers_of,
    prefixed_mamba_config,
    require,
    to_float,
)
from blazr.errors import CheckpointError

ARCH = "FalconH1ForCausalLM"
PREFIX = "model."


@dataclass(frozen=True)
class FalconH1Multipliers:
    """The per-weight µP multipliers of a FalconH1 model (1.0: none)."""

    attention_in: float = 1.0
    attention_out: float = 1.0
    key: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # in_proj row segments z | x | B | C | dt
    mlp_gate: float = 1.0
    mlp_down: float = 1.0


@dataclass(frozen=True)
class FalconH1ModelConfig(ModelConfig):
    """A ModelConfig that also carries the multipliers the name map folds into weights at load."""

    multipliers: FalconH1Multipliers = field(default_factory=FalconH1Multipliers)


def _floats(raw: Raw, key: str, n: int) -> tuple[float, ...]:
    value = raw.get(key)
    if value is None:
        return (1.0,) * n
    if not isinstance(value, list) or len(value) != n:
        raise CheckpointError(f"{raw.path}: {key} must list {n} numbers, found {value!r}")
    return tuple(to_float(v, 1.0, f"{raw.path}: {key}") for v in value)


def multipliers_from(raw: Raw) -> FalconH1Multipliers:
    gate, down = _floats(raw, "mlp_multipliers", 2)
    return FalconH1Multipliers(
        attention_in=raw.float("attention_in_multiplier", 1.0),
        attention_out=raw.float("attention_out_multiplier", 1.0),
        key=raw.float("key_multiplier", 1.0),
        ssm_in=raw.float("ssm_in_multiplier", 1.0),
        ssm_out=raw.float("ssm_out_multiplier", 1.0),
        ssm=_floats(raw, "ssm_multipliers", 5),
        mlp_gate=gate,
        mlp_down=down,
    )


def build_falcon_h1(raw: Raw, shapes: Shapes) -> FalconH1ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    max_pos = raw.int("max_position_embeddings", 8192)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    check_silu(raw, "hidden_act")
    act = activation(raw.get("hidden_act", "silu"))

    def rope(head_dim: int) -> RopeConfig:
        return rope_from_raw(raw, head_dim, max_pos)

    layers = []
    for i in range(num_layers):
        p = f"{PREFIX}layers.{i}."
        mamba = prefixed_mamba_config(
            raw,
            shapes,
            p + "mamba.",
            norm.eps,
            is_norm_before_gate=bool(raw.get("mamba_norm_before_gate", True)),
            has_gated_norm=None if raw.get("mamba_rms_norm") is None else bool(raw.get("mamba_rms_norm")),
        )
        mlp = MLPConfig(
            intermediate_size=require(shapes, p + "feed_forward.gate_proj.weight")[0],
            activation=act,
            has_bias=p + "feed_forward.gate_proj.bias" in shapes,
        )
        attention = attention_config(raw, shapes, p + "self_attn.", rope)
        layers.append(LayerConfig(mixers=(attention, mamba), mlp=mlp, norm=norm, ffn_norm=norm))
    return FalconH1ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
        embedding_multiplier=raw.float("embedding_multiplier", 1.0),
        logits_scale=raw.float("lm_head_multiplier", 1.0),
        multipliers=multipliers_from(raw),
    )


def _is_falcon_h1(shapes: Shapes) -> bool:
    """A layer holding both a Mamba2 mixer and attention."""
    layers = PREFIX + "layers."
    return bool(layers_with(shapes, layers, "mamba.dt_bias") & layers_with(shapes, layers, "self_attn."))


BUILDERS = {ARCH: build_falcon_h1}
MODEL_TYPES = {"falcon_h1": ARCH}
NAME_RULES = [(_is_falcon_h1, ARCH)]
