"""HF `MambaForCausalLM` and `FalconMambaForCausalLM` detection (Mamba1 in transformers' layout, e.g.
state-spaces/mamba-130m-hf, tiiuae/falcon-mamba-7b): every block is RMSNorm → Mamba1 mixer → residual; no
feed-forward. Tensors under `backbone.` (`embeddings`, `layers.N.{norm, mixer.*}`, `norm_f`) plus `lm_head`.
Falcon-Mamba RMS-normalises dt, B and C without weights (`mixer_rms_eps`).

Every size comes from the tensors (`mamba1_config`, shared with Jamba): the inner width from out_proj
[D, Di], the state size from A_log [Di, N], the dt rank from dt_proj [Di, R], the kernel from conv1d
[Di, 1, K], biases from their presence. config.json adds eps, tied embeddings and, by its architecture or
model_type, Falcon-Mamba's norms — which no shape shows: without config.json a checkpoint is plain Mamba.
"""

from __future__ import annotations

from blazr.config import LayerConfig, Mamba1Config, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw
from blazr.detect.ssm_common import check_silu, every_layer_has, is_tied, num_layers_of, require

ARCH = "MambaForCausalLM"
FALCON_ARCH = "FalconMambaForCausalLM"
PREFIX = "backbone."


def mamba1_config(
    shapes: Shapes, prefix: str, *, has_dt_bc_norm: bool, has_norm_weights: bool, norm_eps: float
) -> Mamba1Config:
    """A Mamba1 mixer whose HF tensors live under `prefix` (…in_proj.weight, …A_log, …), sized by them."""
    d_inner, state = require(shapes, prefix + "A_log")
    return Mamba1Config(
        d_inner=d_inner,
        state_size=state,
        dt_rank=require(shapes, prefix + "dt_proj.weight")[1],
        conv_kernel=require(shapes, prefix + "conv1d.weight")[2],
        has_conv_bias=prefix + "conv1d.bias" in shapes,
        has_proj_bias=prefix + "in_proj.bias" in shapes,
        has_dt_bc_norm=has_dt_bc_norm,
        has_norm_weights=has_norm_weights,
        norm_eps=norm_eps,
    )


def build_mamba1(raw: Raw, shapes: Shapes, arch: str = ARCH) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embeddings.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    check_silu(raw, "hidden_act")
    norm = NormConfig("rms", raw.float("layer_norm_epsilon", 1e-5))
    is_falcon = arch == FALCON_ARCH
    eps = raw.float("mixer_rms_eps", 1e-6)
    layers = tuple(
        LayerConfig(
            mixers=(
                mamba1_config(
                    shapes,
                    f"{PREFIX}layers.{i}.mixer.",
                    has_dt_bc_norm=is_falcon,
                    has_norm_weights=False,
                    norm_eps=eps,
                ),
            ),
            norm=norm,
        )
        for i in range(num_layers)
    )
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=layers,
        final_norm=norm,
        max_position_embeddings=raw.int("max_position_embeddings", 1 << 20),
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_mamba1(shapes: Shapes) -> bool:
    """`backbone.embeddings` with a Mamba1 mixer (x_proj) in every layer."""
    return PREFIX + "embeddings.weight" in shapes and every_layer_has(
        shapes, PREFIX + "layers.", "mixer.x_proj."
    )


BUILDERS = {ARCH: build_mamba1, FALCON_ARCH: lambda raw, shapes: build_mamba1(raw, shapes, FALCON_ARCH)}
MODEL_TYPES = {"mamba": ARCH, "falcon_mamba": FALCON_ARCH}
NAME_RULES = [(_is_mamba1, ARCH)]  # before Mamba2's rule (modules in name order): Mamba1 has A_log too
