"""The Mamba2 kernels' bindings (decode step and prefill scan), mixed into `Kernels` (bindings.py): both
pass one argument layout to C, validated in one place. Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr

_OP_MAMBA2_STEP, _OP_MAMBA2_PREFILL = 8, 13  # csrc/blazr_kernels.h


class Mamba2Bindings:
    """`mamba2_step` and `mamba2_prefill`; uses the `_args()` / `_run()` of the Kernels it is mixed into."""

    def mamba2_step(
        self,
        xbc: torch.Tensor,
        dt_raw: torch.Tensor,
        slots: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        D: torch.Tensor,
        ssm_state: torch.Tensor,
        n_groups: int,
        dt_min: float,
        dt_max: float,
    ) -> torch.Tensor:
        if slots.numel() != xbc.shape[0]:
            raise ValueError(f"mamba2_step: {slots.numel()} slots for {xbc.shape[0]} rows")
        return self._mamba2(
            _OP_MAMBA2_STEP, "mamba2_step", xbc, dt_raw, slots, slots.numel(), conv_weight, conv_bias,
            conv_state, dt_bias, A_log, D, ssm_state, n_groups, dt_min, dt_max,
        )  # fmt: skip

    def mamba2_prefill(
        self,
        xbc: torch.Tensor,
        dt_raw: torch.Tensor,
        query_lens: Sequence[int],
        slots: torch.Tensor,
        fresh: Sequence[bool],
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        D: torch.Tensor,
        ssm_state: torch.Tensor,
        n_groups: int,
        dt_min: float,
        dt_max: float,
    ) -> torch.Tensor:
        Bsz = len(query_lens)
        if not (xbc.is_cpu and slots.is_cpu):
            raise UnsupportedInput("mamba2_prefill: CPU tensors only")
        if slots.numel() != Bsz or len(fresh) != Bsz or sum(query_lens) != xbc.shape[0]:
            raise ValueError(
                f"mamba2_prefill: {xbc.shape[0]} rows, query_lens {list(query_lens)}, {slots.numel()} slots "
                f"and {len(fresh)} fresh flags are inconsistent"
            )
        starts = accumulate(query_lens[:-1], initial=0)
        seqs = torch.tensor(
            list(zip(starts, query_lens, slots.tolist(), (int(f) for f in fresh), strict=True)),
            dtype=torch.int64,
        ).reshape(Bsz, 4)
        return self._mamba2(
            _OP_MAMBA2_PREFILL, "mamba2_prefill", xbc, dt_raw, seqs, Bsz, conv_weight, conv_bias,
            conv_state, dt_bias, A_log, D, ssm_state, n_groups, dt_min, dt_max,
        )  # fmt: skip

    def _mamba2(
        self,
        op: int,
        name: str,
        xbc: torch.Tensor,
        dt_raw: torch.Tensor,
        index: torch.Tensor,
        Bsz: int,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        D: torch.Tensor,
        ssm_state: torch.Tensor,
        n_groups: int,
        dt_min: float,
        dt_max: float,
    ) -> torch.Tensor:
        """The call both Mamba2 kernels share: `index` is the decode step's slots [B] or the prefill's
        per-sequence (row0, n, slot, fresh) [B, 4]; y [rows, H, P] is returned."""
        T, H = dt_raw.shape
        S, _, P, N = ssm_state.shape
        Cd, K = conv_weight.shape
        if (
            ssm_state.shape[1] != H
            or xbc.shape != (T, Cd)
            or Cd != H * P + 2 * n_groups * N
            or conv_state.shape != (S, Cd, K - 1)
        ):
            raise ValueError(
                f"{name}: xbc {list(xbc.shape)}, dt_raw {list(dt_raw.shape)}, conv_weight "
                f"{list(conv_weight.shape)}, conv_state {list(conv_state.shape)}, ssm_state "
                f"{list(ssm_state.shape)} with {n_groups} groups are inconsistent"
            )
        ld = xbc.stride(0)
        if xbc.stride(1) != 1 or dt_raw.stride(1) != 1 or dt_raw.stride(0) != ld or not xbc.is_cpu:
            raise UnsupportedInput(f"{name}: xbc and dt_raw must be column views of one row-major buffer")
        if xbc.dtype is not _F32 or dt_raw.dtype is not _F32:
            raise UnsupportedInput(f"{name}: expected fp32 inputs, found {xbc.dtype}")
        y = torch.empty(T, H, P, dtype=_F32)
        a, addr = self._args()
        a.op = op
        a.i[0:20] = (
            xbc.data_ptr(),
            dt_raw.data_ptr(),
            ld,
            _i64_ptr(index, f"{name} slots"),
            Bsz,
            _f32_ptr(conv_weight, f"{name} conv_weight"),
            _f32_ptr(conv_bias, f"{name} conv_bias"),
            _f32_ptr(conv_state, f"{name} conv_state"),
            K,
            _f32_ptr(dt_bias, f"{name} dt_bias"),
            _f32_ptr(A_log, f"{name} A_log"),
            _f32_ptr(D, f"{name} D"),
            _f32_ptr(ssm_state, f"{name} ssm_state"),
            S,
            H,
            P,
            n_groups,
            N,
            y.data_ptr(),
            torch.get_num_threads(),
        )
        a.f[0], a.f[1] = dt_min, dt_max
        kept = (xbc, dt_raw, index, conv_weight, conv_bias, conv_state, dt_bias, A_log, D, ssm_state, y)
        self._run(a, addr, name, *kept)
        return y
