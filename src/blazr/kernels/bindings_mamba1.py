"""The Mamba1 kernels' bindings (csrc/mamba1.c): x_proj's output split into dt and [B | C] with the optional
RMS norms, and the selective scan — decode step and prefill, one C entry point — mixed into `Kernels`
(bindings.py), validated here. Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.bindings_conv import prefill_index
from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr

_OP_MAMBA1_SCAN, _OP_MAMBA1_DT_BC = 22, 23  # csrc/blazr_kernels.h


class Mamba1Bindings:
    """`mamba1_dt_bc`, `mamba1_scan_step` and `mamba1_scan_prefill`; uses the `_args()` / `_run()` of the
    Kernels it is mixed into."""

    def mamba1_dt_bc(
        self,
        dbc: torch.Tensor,
        dt_rank: int,
        state_size: int,
        w_dt: torch.Tensor | None,
        w_b: torch.Tensor | None,
        w_c: torch.Tensor | None,
        is_normed: bool,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        R, N = dt_rank, state_size
        if dbc.dim() != 2 or dbc.shape[1] != R + 2 * N:
            raise ValueError(f"mamba1_dt_bc: dbc {list(dbc.shape)} is not [T, {R} + 2·{N}]")
        T = dbc.shape[0]
        dt, bc = torch.empty(T, R, dtype=_F32), torch.empty(T, 2 * N, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_MAMBA1_DT_BC
        a.i[0:10] = (
            _f32_ptr(dbc, "mamba1_dt_bc dbc"),
            T,
            R,
            N,
            _f32_ptr(w_dt, "mamba1_dt_bc w_dt"),
            _f32_ptr(w_b, "mamba1_dt_bc w_b"),
            _f32_ptr(w_c, "mamba1_dt_bc w_c"),
            int(is_normed),
            dt.data_ptr(),
            bc.data_ptr(),
        )
        a.f[0] = eps
        self._run(a, addr, "mamba1_dt_bc", dbc, w_dt, w_b, w_c, dt, bc)
        return dt, bc

    def mamba1_scan_step(
        self,
        xc: torch.Tensor,
        dt_raw: torch.Tensor,
        bc: torch.Tensor,
        z: torch.Tensor,
        slots: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        ssm: torch.Tensor,
    ) -> torch.Tensor:
        if slots.numel() != xc.shape[0]:
            raise ValueError(f"mamba1_scan_step: {slots.numel()} slots for {xc.shape[0]} rows")
        return self._scan(xc, dt_raw, bc, z, slots, slots.numel(), False, A, D, ssm)

    def mamba1_scan_prefill(
        self,
        xc: torch.Tensor,
        dt_raw: torch.Tensor,
        bc: torch.Tensor,
        z: torch.Tensor,
        query_lens: Sequence[int],
        slots: torch.Tensor,
        fresh: Sequence[bool],
        A: torch.Tensor,
        D: torch.Tensor,
        ssm: torch.Tensor,
    ) -> torch.Tensor:
        if sum(query_lens) != xc.shape[0]:
            raise ValueError(
                f"mamba1_scan_prefill: {xc.shape[0]} rows, query_lens {list(query_lens)} are inconsistent"
            )
        index = prefill_index(query_lens, slots, fresh, "mamba1_scan_prefill")
        return self._scan(xc, dt_raw, bc, z, index, len(query_lens), True, A, D, ssm)

    def _scan(
        self,
        xc: torch.Tensor,
        dt_raw: torch.Tensor,
        bc: torch.Tensor,
        z: torch.Tensor,
        index: torch.Tensor,
        Bsz: int,
        prefill: bool,
        A: torch.Tensor,
        D: torch.Tensor,
        ssm: torch.Tensor,
    ) -> torch.Tensor:
        name = "mamba1_scan_prefill" if prefill else "mamba1_scan_step"
        T, Di = xc.shape
        S, N = ssm.shape[0], ssm.shape[-1]
        if (
            dt_raw.shape != (T, Di)
            or bc.shape != (T, 2 * N)
            or z.shape != (T, Di)
            or A.shape != (Di, N)
            or ssm.shape != (S, Di, N)
        ):
            raise ValueError(
                f"{name}: xc {list(xc.shape)}, dt_raw {list(dt_raw.shape)}, bc {list(bc.shape)}, z "
                f"{list(z.shape)}, A {list(A.shape)}, ssm {list(ssm.shape)} are inconsistent"
            )
        if z.dtype is not _F32 or not z.is_cpu or z.stride(1) != 1 or z.stride(0) < Di:
            raise UnsupportedInput(f"{name}: z must be fp32 CPU rows of contiguous channels")
        y = torch.empty(T, Di, dtype=_F32)
        a, addr = self._args()
        a.op = _OP_MAMBA1_SCAN
        a.i[0:16] = (
            _f32_ptr(xc, f"{name} xc"),
            _f32_ptr(dt_raw, f"{name} dt_raw"),
            _f32_ptr(bc, f"{name} bc"),
            z.data_ptr(),
            z.stride(0),
            _i64_ptr(index, f"{name} slots"),
            Bsz,
            int(prefill),
            _f32_ptr(A, f"{name} A"),
            _f32_ptr(D, f"{name} D"),
            _f32_ptr(ssm, f"{name} ssm"),
            S,
            Di,
            N,
            y.data_ptr(),
            torch.get_num_threads(),
        )
        self._run(a, addr, name, xc, dt_raw, bc, z, index, A, D, ssm, y)
        return y
