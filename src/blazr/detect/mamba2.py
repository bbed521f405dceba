"""HF `Mamba2ForCausalLM` detection (state-spaces Mamba2 in transformers' layout, e.g. Mamba-Codestral):
every block is RMSNorm → Mamba2 mixer → residual; no feed-forward. Tensors live under `backbone.`
(`embeddings`, `layers.N.{norm, mixer.*}`, `norm_f`) plus `lm_head`.

config.json keys: num_heads, head_dim, state_size, n_groups, conv_kernel, chunk_size, layer_norm_epsilon,
time_step_limit, tie_word_embeddings. Without config.json every size comes from the shapes except the
n_groups / state split (transformers' default n_groups 8 is assumed where it divides, else 1), and the
chunk size (256; the math does not depend on it).
"""

from __future__ import annotations

from blazr.config import LayerConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw
from blazr.detect.ssm_common import (
    MambaDefaults,
    MambaKeys,
    check_silu,
    dt_limit,
    every_layer_has,
    is_tied,
    mamba_config,
    num_layers_of,
    require,
)

ARCH = "Mamba2ForCausalLM"
PREFIX = "backbone."
KEYS = MambaKeys(
    num_heads=("num_heads",),
    head_dim=("head_dim",),
    state_size=("state_size",),
    n_groups=("n_groups",),
    conv_kernel=("conv_kernel",),
    chunk_size=("chunk_size",),
)
DEFAULTS = MambaDefaults(n_groups=8, chunk_size=256)


def build_mamba2(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embeddings.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    check_silu(raw, "hidden_act")
    norm = NormConfig("rms", raw.float("layer_norm_epsilon", 1e-5))
    dt_min, dt_max = dt_limit(raw)
    layers = tuple(
        LayerConfig(
            mixers=(
                mamba_config(
                    raw,
                    shapes,
                    f"{PREFIX}layers.{i}.mixer.",
                    KEYS,
                    DEFAULTS,
                    dt_min=dt_min,
                    dt_max=dt_max,
                    norm_eps=norm.eps,
                ),
            ),
            norm=norm,
        )
        for i in range(num_layers)
    )
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=layers,
        final_norm=norm,
        max_position_embeddings=raw.int("max_position_embeddings", 4096),
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_mamba2(shapes: Shapes) -> bool:
    """`backbone.embeddings` with a Mamba2 mixer (A_log) in every layer; a NemotronH has other blocks."""
    has_embeddings = PREFIX + "embeddings.weight" in shapes
    return has_embeddings and every_layer_has(shapes, PREFIX + "layers.", "mixer.A_log")


BUILDERS = {ARCH: build_mamba2}
MODEL_TYPES = {"mamba2": ARCH}
NAME_RULES = [(_is_mamba2, ARCH)]
