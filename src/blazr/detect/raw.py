"""Typed access to raw config.json values and the shared parsing rules (RoPE variants, EOS ids,
activations, shape look-ups) used by every architecture's detector."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blazr.config import RopeConfig
from blazr.detect.checkpoint import Shapes
from blazr.errors import CheckpointError, UnsupportedError

log = logging.getLogger("blazr.detect")


class Raw:
    """config.json values with typed accessors; a missing key returns the default (or raises)."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise CheckpointError(f"{self.path}: {key} must be an integer, found {value!r}")
        return int(value)

    def float(self, key: str, default: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CheckpointError(f"{self.path}: {key} must be a number, found {value!r}")
        return float(value)


def need(value: int | None, field: str, how: str) -> int:
    if value is None:
        raise CheckpointError(f"cannot determine {field}: not in config.json and {how}")
    return value


def shape_of(shapes: Shapes, name: str) -> tuple[int, ...] | None:
    return shapes.get(name)


def layer_indices(shapes: Shapes, prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    return sorted({int(m.group(1)) for n in shapes if (m := pat.match(n))})


def guess_head_dim(
    q_rows: int, kv_rows: int | None, prefer: tuple[int, ...] = (128, 64, 256, 96, 80, 32, 16)
) -> int:
    """Heads are not recoverable from weight shapes alone; assume the first common head size (in `prefer`
    order) that divides both projections (callers log a warning saying so)."""
    for hd in prefer:
        if q_rows % hd == 0 and (kv_rows is None or kv_rows % hd == 0):
            return hd
    return q_rows


def rope_from_raw(raw: Raw, dim: int, max_pos: int) -> RopeConfig:
    """RoPE from transformers-v4 (`rope_theta`, `rope_scaling`) or v5 (`rope_parameters`) keys."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise CheckpointError(f"{raw.path}: rope_parameters / rope_scaling must be objects")
    theta = float(params.get("rope_theta") or raw.float("rope_theta", 10000.0))
    merged = {**params, **scaling}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    factor = float(merged.get("factor") or 1.0)
    orig = int(merged.get("original_max_position_embeddings") or max_pos)
    if kind == "default":
        return RopeConfig(dim=dim, theta=theta)
    if kind == "linear":
        return RopeConfig(dim=dim, theta=theta, scaling="linear", factor=factor)
    if kind == "llama3":
        return RopeConfig(
            dim=dim,
            theta=theta,
            scaling="llama3",
            factor=factor,
            original_max_position=orig,
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        )
    if kind == "yarn":
        return yarn_rope(dim, theta, merged, max_pos)
    if kind in ("longrope", "su"):  # "su": Phi-3's first name for it
        orig = merged.get("original_max_position_embeddings") or raw.int("original_max_position_embeddings")
        if not orig:
            raise CheckpointError(f"{raw.path}: longrope rope needs original_max_position_embeddings")
        return longrope(raw, dim, theta, merged, max_pos, int(orig))
    raise UnsupportedError(
        f"{raw.path}: rope type {kind!r} is not supported (default, linear, llama3, yarn, longrope)"
    )


def longrope_attention_factor(factor: float, orig: int) -> float:
    """LongRoPE's cos/sin multiplier for a context `factor` times the original `orig`:
    √(1 + ln factor / ln orig)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))


def longrope(raw: Raw, dim: int, theta: float, p: Mapping[str, Any], max_pos: int, orig: int) -> RopeConfig:
    """LongRoPE (transformers' `_compute_longrope_parameters`): `short_factor` / `long_factor`, one divisor
    per frequency (dim/2 each); the attention factor as given, else from `factor`, else from the context
    ratio max_position_embeddings / original_max_position_embeddings (Phi-3's rule)."""
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = p.get(key)
        if not isinstance(value, list) or len(value) != dim // 2:
            raise CheckpointError(
                f"{raw.path}: rope {key} must list {dim // 2} numbers (rotary dim {dim} / 2), found {value!r}"
            )
        factors[key] = tuple(float(v) for v in value)
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = longrope_attention_factor(float(p.get("factor") or max_pos / orig), orig)
    return RopeConfig(
        dim=dim,
        theta=theta,
        scaling="longrope",
        original_max_position=orig,
        attention_factor=float(attention_factor),
        **factors,
    )


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_rope(dim: int, theta: float, p: Mapping[str, Any], max_pos: int) -> RopeConfig:
    orig = int(p.get("original_max_position_embeddings") or max_pos)
    factor = float(p.get("factor") or max_pos / orig)
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention_factor = yarn_mscale(factor)
    return RopeConfig(
        dim=dim,
        theta=theta,
        scaling="yarn",
        factor=factor,
        original_max_position=orig,
        beta_fast=float(p.get("beta_fast") or 32.0),
        beta_slow=float(p.get("beta_slow") or 1.0),
        is_truncated=bool(p.get("truncate", True)),
        attention_factor=float(attention_factor),
    )


def eos_ids(raw: Mapping[str, Any]) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(int(v) for v in value if isinstance(v, int))
    return ()


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def activation(name: str) -> str:
    """A transformers `hidden_act` as blazr's Activation: its "gelu" is the exact (erf) GELU, its
    "gelu_pytorch_tanh" / "gelu_new" the tanh approximation."""
    acts = {
        "silu": "silu",
        "swish": "silu",
        "gelu": "gelu_erf",
        "gelu_pytorch_tanh": "gelu",
        "gelu_new": "gelu",
        "relu2": "relu2",
    }
    if name not in acts:
        raise UnsupportedError(f"activation {name!r} is not supported ({', '.join(acts)})")
    return acts[name]
