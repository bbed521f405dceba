"""The gated DeltaNet kernels' bindings (decode step and chunked prefill, csrc/deltanet.c) and those of gated
attention's pieces and other row glue (per-head RMSNorm, sigmoid gate, plain product, row copy:
csrc/gates.c), mixed into `Kernels` (bindings.py). Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr

# csrc/blazr_kernels.h
_OP_DELTANET_STEP, _OP_DELTANET_PREFILL, _OP_HEAD_RMS_NORM, _OP_SIGMOID_MUL = 30, 31, 32, 33
_OP_MUL, _OP_COPY_ROWS = 34, 35


class DeltaNetBindings:
    """`deltanet_step`, `deltanet_prefill`, `head_rms_norm`, `sigmoid_mul`, `mul`, `copy_rows`; uses the
    `_args()` / `_run()` of the Kernels it is mixed into."""

    def deltanet_step(
        self,
        qkvz: torch.Tensor,
        ba: torch.Tensor,
        slots: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        norm_weight: torch.Tensor,
        state: torch.Tensor,
        num_k_heads: int,
        is_v_tiled: bool,
        beta_scale: float,
        eps: float,
    ) -> torch.Tensor:
        if slots.numel() != qkvz.shape[0]:
            raise ValueError(f"deltanet_step: {slots.numel()} slots for {qkvz.shape[0]} rows")
        y = self._deltanet_check("deltanet_step", qkvz, ba, conv_weight, conv_state, state, num_k_heads)
        B = qkvz.shape[0]
        S, Hv, Dk, Dv = state.shape
        K = conv_weight.shape[1]
        a, addr = self._args()
        a.op = _OP_DELTANET_STEP
        a.i[0:19] = (
            qkvz.data_ptr(), ba.data_ptr(), _i64_ptr(slots, "deltanet_step slots"), B,
            _f32_ptr(conv_weight, "deltanet conv_weight"), _f32_ptr(conv_state, "deltanet conv_state"), K,
            _f32_ptr(dt_bias, "deltanet dt_bias"), _f32_ptr(A_log, "deltanet A_log"),
            _f32_ptr(norm_weight, "deltanet norm"), _f32_ptr(state, "deltanet state"), S, num_k_heads, Hv, Dk,
            Dv, int(is_v_tiled), y.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        a.f[0], a.f[1] = beta_scale, eps
        kept = (qkvz, ba, slots, conv_weight, conv_state, dt_bias, A_log, norm_weight, state, y)
        self._run(a, addr, "deltanet_step", *kept)
        return y

    def deltanet_prefill(
        self,
        qkvz: torch.Tensor,
        ba: torch.Tensor,
        query_lens: Sequence[int],
        slots: torch.Tensor,
        fresh: Sequence[bool],
        saves: Sequence[tuple[int, int, int]],
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        norm_weight: torch.Tensor,
        state: torch.Tensor,
        num_k_heads: int,
        is_v_tiled: bool,
        beta_scale: float,
        eps: float,
        chunk_size: int,
    ) -> torch.Tensor:
        Bsz = len(query_lens)
        if not (qkvz.is_cpu and slots.is_cpu):
            raise UnsupportedInput("deltanet_prefill: CPU tensors only")
        if slots.numel() != Bsz or len(fresh) != Bsz or sum(query_lens) != qkvz.shape[0]:
            raise ValueError(
                f"deltanet_prefill: {qkvz.shape[0]} rows, query_lens {list(query_lens)}, {slots.numel()} "
                f"slots and {len(fresh)} fresh flags are inconsistent"
            )
        y = self._deltanet_check("deltanet_prefill", qkvz, ba, conv_weight, conv_state, state, num_k_heads)
        starts = accumulate(query_lens[:-1], initial=0)
        seqs = torch.tensor(
            list(zip(starts, query_lens, slots.tolist(), (int(f) for f in fresh), strict=True)),
            dtype=torch.int64,
        ).reshape(Bsz, 4)
        cuts = torch.tensor(list(saves), dtype=torch.int64).reshape(len(saves), 3)
        S, Hv, Dk, Dv = state.shape
        K = conv_weight.shape[1]
        a, addr = self._args()
        a.op = _OP_DELTANET_PREFILL
        a.i[0:22] = (
            qkvz.data_ptr(), ba.data_ptr(), seqs.data_ptr(), Bsz, cuts.data_ptr(), len(saves),
            _f32_ptr(conv_weight, "deltanet conv_weight"), _f32_ptr(conv_state, "deltanet conv_state"), K,
            _f32_ptr(dt_bias, "deltanet dt_bias"), _f32_ptr(A_log, "deltanet A_log"),
            _f32_ptr(norm_weight, "deltanet norm"), _f32_ptr(state, "deltanet state"), S, num_k_heads, Hv, Dk,
            Dv, int(is_v_tiled), chunk_size, y.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        a.f[0], a.f[1] = beta_scale, eps
        kept = (qkvz, ba, seqs, cuts, conv_weight, conv_state, dt_bias, A_log, norm_weight, state, y)
        self._run(a, addr, "deltanet_prefill", *kept)
        return y

    def _deltanet_check(
        self,
        name: str,
        qkvz: torch.Tensor,
        ba: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        state: torch.Tensor,
        num_k_heads: int,
    ) -> torch.Tensor:
        """Shapes and layouts both DeltaNet kernels take; returns the output y [T, Hv·Dv] to fill."""
        S, Hv, Dk, Dv = state.shape
        C, K = conv_weight.shape
        T = qkvz.shape[0]
        if (
            2 * num_k_heads * Dk + Hv * Dv != C
            or qkvz.shape != (T, C + Hv * Dv)
            or ba.shape != (T, 2 * Hv)
            or conv_state.shape != (S, C, K - 1)
        ):
            raise ValueError(
                f"{name}: qkvz {list(qkvz.shape)}, ba {list(ba.shape)}, conv_weight "
                f"{list(conv_weight.shape)}, conv_state {list(conv_state.shape)}, state {list(state.shape)} "
                f"with {num_k_heads} key heads are inconsistent"
            )
        for t, what in ((qkvz, "qkvz"), (ba, "ba")):
            if t.dtype is not _F32 or not t.is_cpu or not t.is_contiguous():
                raise UnsupportedInput(f"{name}: {what} must be contiguous fp32 CPU rows, found {t.dtype}")
        return torch.empty(T, Hv * Dv, dtype=_F32)

    def head_rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dim() != 3 or weight.numel() != x.shape[2]:
            raise ValueError(f"head_rms_norm: x [T, H, D] and weight [D] expected, found {list(x.shape)}")
        if out is not None and out.shape != x.shape:
            raise ValueError(f"head_rms_norm: out {list(out.shape)} for x {list(x.shape)}")
        T, H, D = x.shape
        for t in (x,) if out is None else (x, out):
            if t.dtype is not _F32 or not t.is_cpu or t.stride(2) != 1 or (H > 1 and t.stride(1) != D):
                raise UnsupportedInput(
                    f"head_rms_norm: expected fp32 CPU [T, H, D] rows of heads, found {t.dtype}"
                )
        a, addr = self._args()
        a.op = _OP_HEAD_RMS_NORM
        ldt = x.stride(0) if T > 1 else H * D
        ldo = 0 if out is None else out.stride(0) if T > 1 else H * D
        a.i[0:9] = (
            x.data_ptr(),
            T,
            H,
            D,
            ldt,
            _f32_ptr(weight, "head_rms_norm weight"),
            0 if out is None else out.data_ptr(),
            ldo,
            torch.get_num_threads(),
        )
        a.f[0] = eps
        if out is None:
            self._run(a, addr, "head_rms_norm", x, weight)
            return x
        self._run(a, addr, "head_rms_norm", x, weight, out)
        return out

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self._gate_rows("sigmoid_mul", _OP_SIGMOID_MUL, x, gate)

    def mul(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._gate_rows("mul", _OP_MUL, x, y)

    def copy_rows(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or out.shape != x.shape:
            raise ValueError(
                f"copy_rows: x and out [M, N] expected, found {list(x.shape)}, {list(out.shape)}"
            )
        _check_rows("copy_rows", x, out)
        a, addr = self._args()
        a.op = _OP_COPY_ROWS
        a.i[0:6] = (x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr(), out.stride(0))
        self._run(a, addr, "copy_rows", x, out)
        return out

    def _gate_rows(self, name: str, op: int, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x [M, N] ← x · f(gate) in place, gate [M, N] or [M, 1] (rows may be strided)."""
        if (
            x.dim() != 2
            or gate.dim() != 2
            or gate.shape[0] != x.shape[0]
            or gate.shape[1] not in (1, x.shape[1])
        ):
            found = f"{list(x.shape)}, {list(gate.shape)}"
            raise ValueError(f"{name}: x [M, N] and gate [M, N] or [M, 1], found {found}")
        _check_rows(name, x, gate)
        M, N = x.shape
        a, addr = self._args()
        a.op = op
        a.i[0:8] = (
            x.data_ptr(),
            M,
            N,
            x.stride(0),
            gate.data_ptr(),
            gate.stride(0),
            gate.shape[1],
            torch.get_num_threads(),
        )
        self._run(a, addr, name, x, gate)
        return x


def _check_rows(name: str, *tensors: torch.Tensor) -> None:
    """UnsupportedInput unless every tensor [M, N] is fp32 CPU rows (each contiguous; rows may be strided)."""
    for t in tensors:
        if t.dtype is not _F32 or not t.is_cpu or (t.shape[1] > 1 and t.stride(1) != 1):
            raise UnsupportedInput(f"{name}: expected fp32 CPU rows, found {t.dtype} on {t.device}")
