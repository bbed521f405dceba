"""HF `JambaForCausalLM` detection (Jamba v0.1 / 1.5 / tiny-dev): each layer holds a Mamba1 mixer with
weighted dt / B / C RMS norms (`mamba.`) or NoPE GQA attention (`self_attn.`), then a SwiGLU `feed_forward` —
a softmax top-k MoE (`router`, `experts.N.{gate,up,down}_proj`, weights not renormalised) in the expert
layers, a dense MLP in the others. Norms `input_layernorm`, `pre_ff_layernorm`, final `final_layernorm`, all
with `rms_norm_eps`.

Layer kinds: attention where i % attn_layer_period == attn_layer_offset (`layers_block_type` when given), else
Mamba1; MoE where i % expert_layer_period == expert_layer_offset and num_experts > 1 — else which of
`mamba.` / `self_attn.` and `feed_forward.router` each layer holds. The Mamba1 sizes come from the tensors.
"""

from __future__ import annotations

from blazr.config import (
    LayerConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.mamba1 import mamba1_config
from blazr.detect.raw import Raw, activation
from blazr.detect.ssm_common import (
    attention_config,
    is_tied,
    layers_with,
    mamba_or_attention,
    num_layers_of,
    require,
)
from blazr.errors import CheckpointError

ARCH = "JambaForCausalLM"
PREFIX = "model."


def _every(raw: Raw, period: str, offset: str, num_layers: int) -> list[bool] | None:
    p, o = raw.int(period), raw.int(offset)
    if p is None or o is None:
        return None
    if p <= 0:
        raise CheckpointError(f"{raw.path}: {period} must be positive, found {p}")
    return [i % p == o for i in range(num_layers)]


def _is_attention(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    kinds = raw.get("layers_block_type")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != num_layers or set(kinds) - {"attention", "mamba"}:
            raise CheckpointError(
                f"{raw.path}: layers_block_type must list {num_layers} of attention / mamba"
            )
        return [k == "attention" for k in kinds]
    every = _every(raw, "attn_layer_period", "attn_layer_offset", num_layers)
    if every is not None:
        return every
    return [k == "attention" for k in mamba_or_attention(shapes, PREFIX + "layers.", num_layers)]


def _is_moe(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    if raw.int("num_experts", 2) <= 1:
        return [False] * num_layers
    every = _every(raw, "expert_layer_period", "expert_layer_offset", num_layers)
    if every is not None:
        return every
    moe = layers_with(shapes, PREFIX + "layers.", "feed_forward.router.")
    return [i in moe for i in range(num_layers)]


def build_jamba(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    act = activation(raw.get("hidden_act", "silu"))
    layers = []
    for i, (is_attn, is_moe) in enumerate(
        zip(_is_attention(raw, shapes, num_layers), _is_moe(raw, shapes, num_layers), strict=True)
    ):
        p = f"{PREFIX}layers.{i}."
        if is_attn:
            mixer: MixerConfig = attention_config(raw, shapes, p + "self_attn.", lambda head_dim: None)
        else:
            mixer = mamba1_config(
                shapes, p + "mamba.", has_dt_bc_norm=True, has_norm_weights=True, norm_eps=norm.eps
            )
        f = p + "feed_forward."
        if is_moe:
            num_experts = raw.int("num_experts") or require(shapes, f + "router.weight")[0]
            expert = MLPConfig(require(shapes, f + "experts.0.gate_proj.weight")[0], act)
            moe = MoEConfig(num_experts, raw.int("num_experts_per_tok", 2), expert, is_renormalized=False)
            layers.append(LayerConfig(mixers=(mixer,), moe=moe, norm=norm, ffn_norm=norm))
        else:
            mlp = MLPConfig(require(shapes, f + "gate_proj.weight")[0], act)
            layers.append(LayerConfig(mixers=(mixer,), mlp=mlp, norm=norm, ffn_norm=norm))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=raw.int("max_position_embeddings", raw.int("n_ctx", 262144)),
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_jamba(shapes: Shapes) -> bool:
    return bool(layers_with(shapes, PREFIX + "layers.", "mamba.x_proj."))


BUILDERS = {ARCH: build_jamba}
MODEL_TYPES = {"jamba": ARCH}
NAME_RULES = [(_is_jamba, ARCH)]
