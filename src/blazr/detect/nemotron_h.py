"""HF `NemotronHForCausalLM` detection: one mixer per block, each block RMSNorm → mixer → residual. Block
kinds: M Mamba2, * attention (NoPE, no biases), - relu² MLP (ungated), E MoE (sigmoid router with an
`e_score_correction_bias` for selection, optional group-limited top-k over top-2-sum group scores, ungated
relu² experts plus always-on shared experts; Nemotron 3 Super's latent MoE runs the routed experts in a
smaller space between `fc1_latent_proj` and `fc2_latent_proj`, its width from their shapes). The MLP and MoE
blocks are blazr layers with no mixer, so their norm is the layer's `ffn_norm`. Tensors live under `backbone.`
(`embeddings`, `layers.N.{norm, mixer.*}`, `norm_f`).

Block kinds: `layers_block_type` / `layer_types` (v5 or legacy names), else `hybrid_override_pattern`
("M-*E" strings, as real checkpoints ship), else which mixer tensors each block holds. Legacy
`mamba_*`-prefixed keys (mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_dt_min …) are read too. The
Mamba2 dt is clamped below at `time_step_min` (transformers: limit (time_step_min, ∞)). The SSM state is
float32 in blazr whatever `mamba_ssm_cache_dtype` says (it says float32). Without config.json: transformers'
defaults (n_groups 8 where it divides, chunk 128, eps 1e-5, dt_min 0.001, top-2 of 1 group, renormalised,
scale 1; heads from the common head size that divides the projections).
"""

from __future__ import annotations

import logging
import math

from blazr.config import LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, layer_indices
from blazr.detect.ssm_common import (
    Kind,
    MambaDefaults,
    MambaKeys,
    attention_config,
    check_silu,
    has_prefix,
    is_tied,
    layer_kinds_from_list,
    layer_kinds_from_pattern,
    mamba_config,
    require,
    to_float,
)
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

ARCH = "NemotronHForCausalLM"
PREFIX = "backbone."
KEYS = MambaKeys(
    num_heads=("mamba_num_heads",),
    head_dim=("mamba_head_dim",),
    state_size=("ssm_state_size",),
    n_groups=("n_groups", "mamba_n_groups"),
    conv_kernel=("conv_kernel", "mamba_d_conv"),
    chunk_size=("chunk_size", "mamba_chunk_size"),
)
DEFAULTS = MambaDefaults(n_groups=8, chunk_size=128)
HEAD_DIM_KEYS = ("head_dim", "attention_head_dim")


def _kind_from_names(shapes: Shapes, i: int) -> Kind:
    p = f"{PREFIX}layers.{i}.mixer."
    if has_prefix(shapes, p + "A_log"):
        return "mamba"
    if has_prefix(shapes, p + "q_proj."):
        return "attention"
    if has_prefix(shapes, p + "gate.weight"):
        return "moe"
    if has_prefix(shapes, p + "up_proj."):
        return "mlp"
    raise CheckpointError(f"block {i}: no Mamba2, attention, MoE or MLP tensors under {p}")


def _layer_kinds(raw: Raw, shapes: Shapes) -> list[Kind]:
    kinds = layer_kinds_from_list(raw, ("layers_block_type", "layer_types"), None)
    kinds = kinds or layer_kinds_from_pattern(raw, "hybrid_override_pattern")
    if kinds is not None:
        return kinds
    found = layer_indices(shapes, PREFIX + "layers.")
    if not found:
        raise CheckpointError(f"no {PREFIX}layers.N.* tensors found")
    return [_kind_from_names(shapes, i) for i in range(max(found) + 1)]


def _relu2_mlp(raw: Raw, shapes: Shapes, prefix: str) -> MLPConfig:
    return MLPConfig(
        intermediate_size=require(shapes, prefix + "up_proj.weight")[0],
        activation=activation(raw.get("mlp_hidden_act", "relu2")),
        is_gated=False,
        has_bias=prefix + "up_proj.bias" in shapes,
    )


def _moe(raw: Raw, shapes: Shapes, i: int) -> MoEConfig:
    p = f"{PREFIX}layers.{i}.mixer."
    latent = _latent_size(raw, shapes, p)
    num_experts = raw.int("n_routed_experts", require(shapes, p + "gate.weight")[0])
    fused = shapes.get(p + "experts.up_proj")  # [E, I, D] when stored stacked
    expert_rows = fused[1] if fused else require(shapes, p + "experts.0.up_proj.weight")[0]
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        top_k = min(2, num_experts)
        log.warning("num_experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    shared = None
    if has_prefix(shapes, p + "shared_experts."):
        shared = _relu2_mlp(raw, shapes, p + "shared_experts.")
    act = activation(raw.get("mlp_hidden_act", "relu2"))
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        expert=MLPConfig(intermediate_size=expert_rows, activation=act, is_gated=False),
        scoring="sigmoid",
        is_renormalized=bool(raw.get("norm_topk_prob", True)),
        routed_scaling_factor=raw.float("routed_scaling_factor", 1.0),
        num_groups=raw.int("n_group", 1),
        topk_groups=raw.int("topk_group", 1),
        group_score="top2_sum",
        has_correction_bias=p + "gate.e_score_correction_bias" in shapes,
        shared=shared,
        latent_size=latent,
        has_latent_bias=latent is not None and p + "fc1_latent_proj.bias" in shapes,
    )


def _latent_size(raw: Raw, shapes: Shapes, p: str) -> int | None:
    """Nemotron 3 Super's latent MoE: the width of `fc1_latent_proj` [Lt, D] (config.json's
    `moe_latent_size` must agree); None without the projections."""
    down = shapes.get(p + "fc1_latent_proj.weight")
    declared = raw.int("moe_latent_size")
    if down is None:
        if declared is not None:
            raise CheckpointError(
                f"{p}fc1_latent_proj.weight: expected a [{declared}, D] latent projection "
                "(moe_latent_size in config.json), found none"
            )
        return None
    up = require(shapes, p + "fc2_latent_proj.weight")
    if declared is not None and declared != down[0]:
        raise CheckpointError(
            f"{p}fc1_latent_proj.weight: expected {declared} rows (moe_latent_size), found {list(down)}"
        )
    if tuple(up) != (down[1], down[0]):
        raise CheckpointError(f"{p}fc2_latent_proj.weight: expected [{down[1]}, {down[0]}], found {list(up)}")
    return down[0]


def build_nemotron_h(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embeddings.weight")
    kinds = _layer_kinds(raw, shapes)
    norm = NormConfig("rms", raw.float("layer_norm_epsilon", 1e-5))
    dt_min = to_float(raw.get("time_step_min", raw.get("mamba_dt_min")), 0.001, f"{raw.path}: time_step_min")
    if "mamba" in kinds:
        check_silu(raw, "mamba_hidden_act")
    layers = []
    for i, kind in enumerate(kinds):
        p = f"{PREFIX}layers.{i}.mixer."
        if kind == "mamba":
            mamba = mamba_config(
                raw, shapes, p, KEYS, DEFAULTS, dt_min=dt_min, dt_max=math.inf, norm_eps=norm.eps
            )
            layers.append(LayerConfig(mixers=(mamba,), norm=norm))
        elif kind == "attention":
            # NoPE; the head size is `head_dim` in v5 configs, `attention_head_dim` in the original ones
            attention = attention_config(raw, shapes, p, lambda _: None, None, HEAD_DIM_KEYS)
            layers.append(LayerConfig(mixers=(attention,), norm=norm))
        elif kind == "mlp":
            layers.append(LayerConfig(mlp=_relu2_mlp(raw, shapes, p), ffn_norm=norm))
        else:
            layers.append(LayerConfig(moe=_moe(raw, shapes, i), ffn_norm=norm))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=raw.int("max_position_embeddings", 4096),
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_nemotron_h(shapes: Shapes) -> bool:
    """`backbone.embeddings` with `mixer.*` blocks (an all-Mamba2 one is taken as Mamba2 first)."""
    return PREFIX + "embeddings.weight" in shapes and any(".mixer." in n for n in shapes)


BUILDERS = {ARCH: build_nemotron_h}
MODEL_TYPES = {"nemotron_h": ARCH}
NAME_RULES = [(_is_nemotron_h, ARCH)]
