"""SmolLM3 (`SmolLM3ForCausalLM`) detection: Llama's layout, where the layers `no_rope_layers` marks 0 have no
positional encoding (NoPE; by default every `no_rope_layer_interval`-th — 4th — layer, as llama.cpp's fixed
step), and a sliding window, where `use_sliding_window`, on the layers `layer_types` names
"sliding_attention" (its cache holds only the window: state/layout.py KV groups).

The NoPE layers are not in the tensors: without config.json a SmolLM3 reads as a Llama (names cannot tell).
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import ModelConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_like
from blazr.detect.raw import Raw
from blazr.errors import CheckpointError

ARCH = "SmolLM3ForCausalLM"


def _per_layer(raw: Raw, key: str, num_layers: int) -> list | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != num_layers:
        raise CheckpointError(f"{raw.path}: {key} must list {num_layers} layers, found {value!r}")
    return value


def build_smollm3(raw: Raw, shapes: Shapes) -> ModelConfig:
    # Llama's sizes (SmolLM3's defaults where config.json names none: RMSNorm eps 1e-6, rope θ 2e6)
    defaults = {"rms_norm_eps": 1e-6, "rope_theta": 2000000.0}
    base = llama_like(Raw({**defaults, **raw.data}, raw.path), shapes, "model.", ARCH)
    n = base.num_layers
    interval = raw.int("no_rope_layer_interval", 4) or 4
    has_rope = _per_layer(raw, "no_rope_layers", n) or [int((i + 1) % interval != 0) for i in range(n)]
    kinds = _per_layer(raw, "layer_types", n) or ["full_attention"] * n
    window = raw.int("sliding_window") if raw.get("use_sliding_window", False) else None
    layers = []
    for i, layer in enumerate(base.layers):
        a = layer.mixers[0]
        a = replace(
            a,
            rope=a.rope if has_rope[i] else None,
            sliding_window=window if kinds[i] == "sliding_attention" else None,
        )
        layers.append(replace(layer, mixers=(a,)))
    return replace(base, layers=tuple(layers))


BUILDERS = {ARCH: build_smollm3}
MODEL_TYPES = {"smollm3": ARCH}
