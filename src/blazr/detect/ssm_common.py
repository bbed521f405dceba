"""Detection shared by the HF hybrid state-space families (Mamba2, GraniteMoeHybrid, Bamba, NemotronH,
FalconH1): layer-type names, the Mamba2 mixer and GQA sizes from config keys or tensor shapes, and the
float values transformers v5 writes for infinities (`{"__float__": "Infinity"}`).

Layer-type names: the legacy forms real checkpoints use ("mamba" / "attention", NemotronH's
`hybrid_override_pattern` "M" / "*" / "-" / "E") and transformers v5's ("linear_attention" /
"full_attention" / "mlp" / "moe") map to one `Kind`.

Sizes a tensor carries come from the tensor when config.json is silent: Mamba2 heads from `A_log` [H], the
inner width from `out_proj` [D, Di], n_groups·state from the conv rows (Cd − Di = 2·G·N), the kernel from
`conv1d.weight` [Cd, 1, K], biases and the gated norm from their presence. What no shape carries (chunk
size, dt limits, eps) takes the family's transformers config default (`MambaDefaults`); the G/N split takes
the default n_groups where it leaves a state size that is a multiple of 16, else fewer groups.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from blazr.config import AttentionConfig, Mamba2Config, RopeConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, guess_head_dim, layer_indices, shape_of
from blazr.errors import CheckpointError, UnsupportedError

log = logging.getLogger("blazr.detect")

Kind = Literal["mamba", "attention", "mlp", "moe"]

LAYER_TYPES: dict[str, Kind] = {
    "mamba": "mamba",
    "mamba2": "mamba",
    "linear_attention": "mamba",
    "attention": "attention",
    "full_attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}
PATTERN: dict[str, Kind] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def require(shapes: Shapes, name: str) -> tuple[int, ...]:
    shape = shape_of(shapes, name)
    if shape is None:
        raise CheckpointError(f"missing tensor {name}")
    return shape


def has_prefix(shapes: Shapes, prefix: str) -> bool:
    return any(n.startswith(prefix) for n in shapes)


def int_of(raw: Raw, *keys: str) -> int | None:
    """The first of `keys` present in config.json as an integer ("auto" counts as absent)."""
    for key in keys:
        value = raw.get(key)
        if value is not None and value != "auto":
            return raw.int(key)
    return None


def to_float(value: Any, default: float, where: str) -> float:
    """A config.json number, including transformers v5's tagged form {"__float__": "Infinity"}."""
    if value is None:
        return default
    if isinstance(value, Mapping) and "__float__" in value:
        value = value["__float__"]
    if isinstance(value, bool):
        raise CheckpointError(f"{where} must be a number, found {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{where} must be a number, found {value!r}") from None


def dt_limit(raw: Raw, key: str = "time_step_limit") -> tuple[float, float]:
    """(dt_min, dt_max) from a `time_step_limit` pair; absent → no limit."""
    value = raw.get(key)
    if value is None:
        return 0.0, math.inf
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise CheckpointError(f"{raw.path}: {key} must be a [min, max] pair, found {value!r}")
    where = f"{raw.path}: {key}"
    return to_float(value[0], 0.0, where), to_float(value[1], math.inf, where)


def layer_kinds_from_list(raw: Raw, keys: tuple[str, ...], num_layers: int | None) -> list[Kind] | None:
    """Layer kinds from the first of `keys` that config.json holds as a list of type names."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or (num_layers is not None and len(value) != num_layers):
            count = "the" if num_layers is None else str(num_layers)
            raise CheckpointError(f"{raw.path}: {key} must list {count} layer types, found {value!r}")
        kinds = []
        for i, name in enumerate(value):
            kind = LAYER_TYPES.get(str(name).lower())
            if kind is None:
                raise CheckpointError(
                    f"{raw.path}: {key}[{i}] = {name!r}; expected one of {sorted(LAYER_TYPES)}"
                )
            kinds.append(kind)
        return kinds
    return None


def layer_kinds_from_pattern(raw: Raw, key: str) -> list[Kind] | None:
    """NemotronH's `hybrid_override_pattern`, one character per layer: M mamba, * attention, - mlp, E moe."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or any(c not in PATTERN for c in value):
        raise CheckpointError(f"{raw.path}: {key} must be a string of {''.join(PATTERN)}, found {value!r}")
    return [PATTERN[c] for c in value]


def num_layers_of(raw: Raw, shapes: Shapes, layers_prefix: str) -> int:
    """`num_hidden_layers`, else one more than the highest `{layers_prefix}N.` index."""
    found = layer_indices(shapes, layers_prefix)
    num = raw.int("num_hidden_layers", max(found) + 1 if found else 0)
    if not num:
        raise CheckpointError(f"no {layers_prefix}N.* tensors found")
    return num


def check_silu(raw: Raw, key: str) -> None:
    act = raw.get(key, "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedError(f"{raw.path}: {key} = {act!r}; the Mamba2 conv supports only silu")


@dataclass(frozen=True)
class MambaKeys:
    """config.json key names of one family's Mamba2 settings (the first key present wins)."""

    num_heads: tuple[str, ...]
    head_dim: tuple[str, ...]
    state_size: tuple[str, ...]
    n_groups: tuple[str, ...]
    conv_kernel: tuple[str, ...]
    chunk_size: tuple[str, ...]


@dataclass(frozen=True)
class MambaDefaults:
    """What no tensor shape carries: the family's transformers config defaults."""

    n_groups: int
    chunk_size: int


# Granite, Bamba and FalconH1 name their Mamba2 settings alike, with the same defaults.
PREFIXED_KEYS = MambaKeys(
    num_heads=("mamba_n_heads",),
    head_dim=("mamba_d_head",),
    state_size=("mamba_d_state",),
    n_groups=("mamba_n_groups",),
    conv_kernel=("mamba_d_conv",),
    chunk_size=("mamba_chunk_size",),
)
PREFIXED_DEFAULTS = MambaDefaults(n_groups=1, chunk_size=256)


def prefixed_mamba_config(
    raw: Raw, shapes: Shapes, prefix: str, norm_eps: float, **options: bool | None
) -> Mamba2Config:
    """`mamba_config` of the families naming their settings `mamba_*` (`PREFIXED_KEYS`), dt limited by
    `time_step_limit`; `options`: mamba_config's `is_norm_before_gate` / `has_gated_norm`."""
    dt_min, dt_max = dt_limit(raw)
    return mamba_config(
        raw,
        shapes,
        prefix,
        PREFIXED_KEYS,
        PREFIXED_DEFAULTS,
        dt_min=dt_min,
        dt_max=dt_max,
        norm_eps=norm_eps,
        **options,
    )


def mamba_or_attention(shapes: Shapes, layers_prefix: str, num_layers: int) -> list[Kind]:
    """Mamba2 (`N.mamba.`) or attention (`N.self_attn.`) per layer, from the tensor names alone."""
    kinds: list[Kind] = []
    for i in range(num_layers):
        p = f"{layers_prefix}{i}."
        if has_prefix(shapes, p + "mamba."):
            kinds.append("mamba")
        elif has_prefix(shapes, p + "self_attn."):
            kinds.append("attention")
        else:
            raise CheckpointError(f"layer {i}: no {p}mamba.* or {p}self_attn.* tensors")
    return kinds


def mamba_config(
    raw: Raw,
    shapes: Shapes,
    prefix: str,
    keys: MambaKeys,
    defaults: MambaDefaults,
    *,
    dt_min: float,
    dt_max: float,
    norm_eps: float,
    is_norm_before_gate: bool = False,
    has_gated_norm: bool | None = True,
) -> Mamba2Config:
    """A Mamba2 mixer whose HF tensors live under `prefix` (…in_proj.weight, …A_log, …).
    `has_gated_norm=None`: the gated RMSNorm is optional (FalconH1) and present when `norm.weight` is."""
    num_heads = int_of(raw, *keys.num_heads) or require(shapes, prefix + "A_log")[0]
    d_inner = require(shapes, prefix + "out_proj.weight")[1]
    head_dim = int_of(raw, *keys.head_dim) or d_inner // num_heads
    d_inner = num_heads * head_dim
    conv = require(shapes, prefix + "conv1d.weight")  # [Cd, 1, K]
    groups_x_state = (conv[0] - d_inner) // 2
    state = int_of(raw, *keys.state_size)
    groups = int_of(raw, *keys.n_groups)
    if groups is None:
        if state is not None:
            groups = max(groups_x_state // state, 1)
        else:
            groups = guess_n_groups(groups_x_state, defaults.n_groups)
            log.warning(
                "%s: Mamba2 n_groups is not in config.json (shapes give only n_groups × state = %d); "
                "assuming %d",
                prefix,
                groups_x_state,
                groups,
            )
    if state is None:
        state = groups_x_state // groups
    return Mamba2Config(
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=state,
        n_groups=groups,
        conv_kernel=int_of(raw, *keys.conv_kernel) or conv[2],
        chunk_size=int_of(raw, *keys.chunk_size) or defaults.chunk_size,
        has_in_proj_bias=prefix + "in_proj.bias" in shapes,
        has_out_proj_bias=prefix + "out_proj.bias" in shapes,
        has_conv_bias=prefix + "conv1d.bias" in shapes,
        dt_min=dt_min,
        dt_max=dt_max,
        has_gated_norm=prefix + "norm.weight" in shapes if has_gated_norm is None else has_gated_norm,
        norm_group_size=d_inner // groups,
        is_norm_before_gate=is_norm_before_gate,
        norm_eps=norm_eps,
    )


def guess_n_groups(groups_x_state: int, default: int) -> int:
    """Shapes give only n_groups × state: take the family default, halved until the state size is a multiple
    of 16 (every released Mamba2 uses 16, 64, 128 or 256)."""
    groups = default
    while groups > 1 and (groups_x_state % groups or (groups_x_state // groups) % 16):
        groups //= 2
    return groups


def attention_config(
    raw: Raw,
    shapes: Shapes,
    prefix: str,
    rope: Callable[[int], RopeConfig | None],
    softmax_scale: float | None = None,
    head_dim_keys: tuple[str, ...] = ("head_dim",),
) -> AttentionConfig:
    """GQA sizes of the q/k/v/o projections under `prefix` (heads from config.json, else the common head
    size that divides both projections); biases from their presence. `rope(head_dim)` gives the rotary
    config (None: NoPE); `softmax_scale=None` → head_dim^-0.5."""
    q = require(shapes, prefix + "q_proj.weight")
    k = require(shapes, prefix + "k_proj.weight")
    num_heads = raw.int("num_attention_heads")
    head_dim = int_of(raw, *head_dim_keys)
    if num_heads is None and head_dim is None:
        head_dim = guess_head_dim(q[0], k[0])
        log.warning(
            "num_attention_heads is not in config.json; assuming head_dim %d (%d heads)",
            head_dim,
            q[0] // head_dim,
        )
    if head_dim is None:
        head_dim = q[0] // num_heads
    if num_heads is None:
        num_heads = q[0] // head_dim
    num_kv_heads = raw.int("num_key_value_heads", k[0] // head_dim)
    return AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=rope(head_dim),
        softmax_scale=head_dim**-0.5 if softmax_scale is None else softmax_scale,
        has_qkv_bias=prefix + "q_proj.bias" in shapes,
        has_o_bias=prefix + "o_proj.bias" in shapes,
    )


def is_tied(raw: Raw, shapes: Shapes) -> bool:
    tied = raw.get("tie_word_embeddings")
    return "lm_head.weight" not in shapes if tied is None else bool(tied)


def every_layer_has(shapes: Shapes, layers_prefix: str, part: str) -> bool:
    """True when each `{layers_prefix}N.` layer holds a tensor starting with `part` (and there is one)."""
    found = layer_indices(shapes, layers_prefix)
    return bool(found) and all(has_prefix(shapes, f"{layers_prefix}{i}.{part}") for i in found)


def layers_with(shapes: Shapes, layers_prefix: str, part: str) -> set[int]:
    pat = re.compile(re.escape(layers_prefix) + r"(\d+)\." + re.escape(part))
    return {int(m.group(1)) for n in shapes if (m := pat.match(n))}
