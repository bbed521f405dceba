"""The short-convolution kernels' bindings — the causal depthwise conv (decode step and prefill, one C entry
point: csrc/causal_conv.c) — mixed into `Kernels` (bindings.py), validated here. Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr

_OP_CAUSAL_CONV = 21  # csrc/blazr_kernels.h


def prefill_index(
    query_lens: Sequence[int], slots: torch.Tensor, fresh: Sequence[bool], name: str
) -> torch.Tensor:
    """A prefill's per-sequence (row0, n, slot, fresh) [B, 4] int64, the layout the recurrent kernels read."""
    Bsz = len(query_lens)
    if not slots.is_cpu:
        raise UnsupportedInput(f"{name}: CPU tensors only")
    if slots.numel() != Bsz or len(fresh) != Bsz:
        raise ValueError(
            f"{name}: query_lens {list(query_lens)}, {slots.numel()} slots and {len(fresh)} fresh flags are "
            "inconsistent"
        )
    starts = accumulate(query_lens[:-1], initial=0)
    rows = list(zip(starts, query_lens, slots.tolist(), (int(f) for f in fresh), strict=True))
    return torch.tensor(rows, dtype=torch.int64).reshape(Bsz, 4)


def _column_view(t: torch.Tensor | None, rows: int, cols: int, ld: int, what: str) -> int:
    """data_ptr of an fp32 CPU [rows, cols] whose rows have stride ld (0 for None)."""
    if t is None:
        return 0
    if t.dtype is not _F32 or not t.is_cpu or t.shape != (rows, cols) or t.stride() != (ld, 1):
        raise UnsupportedInput(
            f"{what}: expected fp32 CPU rows of one stride, found {t.dtype} {list(t.shape)}"
        )
    return t.data_ptr()


class ConvBindings:
    """`causal_conv_step` and `causal_conv_prefill`; uses the `_args()` / `_run()` of the
    Kernels it is mixed into."""

    def causal_conv_step(
        self,
        x: torch.Tensor,
        gin: torch.Tensor | None,
        gout: torch.Tensor | None,
        slots: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        state: torch.Tensor,
        silu: bool,
    ) -> torch.Tensor:
        if slots.numel() != x.shape[0]:
            raise ValueError(f"causal_conv_step: {slots.numel()} slots for {x.shape[0]} rows")
        return self._conv(x, gin, gout, slots, slots.numel(), False, weight, bias, state, silu)

    def causal_conv_prefill(
        self,
        x: torch.Tensor,
        gin: torch.Tensor | None,
        gout: torch.Tensor | None,
        query_lens: Sequence[int],
        slots: torch.Tensor,
        fresh: Sequence[bool],
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        state: torch.Tensor,
        silu: bool,
    ) -> torch.Tensor:
        if sum(query_lens) != x.shape[0]:
            raise ValueError(
                f"causal_conv_prefill: {x.shape[0]} rows, query_lens {list(query_lens)} are inconsistent"
            )
        index = prefill_index(query_lens, slots, fresh, "causal_conv_prefill")
        return self._conv(x, gin, gout, index, len(query_lens), True, weight, bias, state, silu)

    def _conv(
        self,
        x: torch.Tensor,
        gin: torch.Tensor | None,
        gout: torch.Tensor | None,
        index: torch.Tensor,
        Bsz: int,
        prefill: bool,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        state: torch.Tensor,
        silu: bool,
    ) -> torch.Tensor:
        name = "causal_conv_prefill" if prefill else "causal_conv_step"
        if x.dim() != 2:
            raise ValueError(f"{name}: x must be [T, C], found {list(x.shape)}")
        T, C = x.shape
        K = weight.shape[-1]
        if weight.shape != (C, K) or state.dim() != 3 or state.shape[1:] != (K - 1, C):
            raise ValueError(
                f"{name}: x {list(x.shape)}, weight {list(weight.shape)}, state {list(state.shape)} are "
                "inconsistent"
            )
        ld = x.stride(0)
        if ld < C:
            raise UnsupportedInput(f"{name}: x rows overlap (stride {ld} < {C} channels)")
        ptrs = [_column_view(t, T, C, ld, f"{name} {w}") for t, w in ((x, "x"), (gin, "gin"), (gout, "gout"))]
        y = torch.empty(T, C, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_CAUSAL_CONV
        a.i[0:16] = (
            *ptrs,
            ld,
            _i64_ptr(index, f"{name} slots"),
            Bsz,
            int(prefill),
            _f32_ptr(weight, f"{name} weight"),
            _f32_ptr(bias, f"{name} bias"),
            _f32_ptr(state, f"{name} state"),
            state.shape[0],
            C,
            K,
            int(silu),
            y.data_ptr(),
            torch.get_num_threads(),
        )
        self._run(a, addr, name, x, gin, gout, index, weight, bias, state, y)
        return y
