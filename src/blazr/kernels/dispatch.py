"""The kernel library's state and the dispatch every op goes through: the bound default library
(`kernels()`, `reset()`), `cpu_f32` (the activations the layers route through the ops), `_dispatch(op,
reference, ...)` (run kernel `op` when the library takes the inputs, else its torch reference) and
`record()` (capture the kernel calls into a `KernelPlan`).

In: `build.py` (load the library), `bindings.Kernels`, `calls.py` (`KernelPlan`, `UnsupportedInput`); out:
used by `ops.py` and the op families it re-exports (`ops_recurrent.py`, `ops_moe_mla.py`), which all import
`_dispatch` from here (so that none of them imports `ops.py`). Moved out of `ops.py`, which re-exports
`kernels`, `reset`, `cpu_f32` and `record`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from blazr.kernels import build
from blazr.kernels.bindings import Kernels
from blazr.kernels.calls import KernelPlan, UnsupportedInput

_default: list[Kernels | None] = []


def kernels() -> Kernels | None:
    """The bound default library, or None when unavailable / disabled (`BLAZR_KERNELS=0`); its host-tuning
    knobs set at first use (kernels/tuning.py: read from the cache, measured once per host and build)."""
    if not _default:
        from blazr.kernels import tuning

        lib = build.load()
        k = Kernels(lib) if lib is not None else None
        _default.append(k)  # first: the measurement's own weights are made by kernels (no recursion)
        if k is not None:
            tuning.apply(k)
    return _default[0]


def reset() -> None:
    """Forget the default library so the next call re-reads `BLAZR_KERNELS` (for tests)."""
    build.reset()
    _default.clear()


# ---------------------------------------------------------------- dispatch


def cpu_f32(x: torch.Tensor) -> bool:
    """x is a float32 CPU tensor: the activations the layers route through these ops (a recordable
    decode step); other dtypes and devices keep the layers' torch code."""
    return x.dtype is torch.float32 and x.is_cpu


def _dispatch(op: str, reference: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run kernel `op` when the library takes these inputs, else `reference` (same signature). While a
    plan is being recorded an unsupported input is an error (the reference would run only once)."""
    k = _default[0] if _default else kernels()
    if k is not None:
        try:
            return getattr(k, op)(*args, **kwargs)
        except UnsupportedInput:
            if k.is_recording():
                raise
    return reference(*args, **kwargs)


@contextlib.contextmanager
def record() -> Iterator[KernelPlan]:
    """Record the kernel calls made on this thread (through the ops) into a KernelPlan for
    one-call replay; needs the C library (RuntimeError without it). See KernelPlan for the rules."""
    k = kernels()
    if k is None:
        raise RuntimeError("kernel recording needs the C kernel library (unavailable or BLAZR_KERNELS=0)")
    with k.record() as plan:
        yield plan
