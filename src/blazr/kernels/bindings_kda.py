"""Kimi Delta Attention's kernel bindings (decode step and chunked prefill, csrc/kda.c), mixed into `Kernels`
(bindings.py). Shapes as in `ops.py`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from blazr.kernels.calls import _F32, UnsupportedInput, _f32_ptr, _i64_ptr

# csrc/blazr_kernels.h
_OP_KDA_STEP, _OP_KDA_PREFILL = 40, 41


class KDABindings:
    """`kda_step`, `kda_prefill`; uses the `_args()` / `_run()` of the Kernels it is mixed into."""

    def kda_step(
        self,
        qkv: torch.Tensor,
        f: torch.Tensor,
        b: torch.Tensor,
        gate: torch.Tensor,
        slots: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        norm_weight: torch.Tensor,
        state: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        if slots.numel() != qkv.shape[0]:
            raise ValueError(f"kda_step: {slots.numel()} slots for {qkv.shape[0]} rows")
        y = self._kda_check("kda_step", qkv, f, b, gate, conv_weight, conv_state, state)
        S, H, D, _ = state.shape
        a, addr = self._args()
        a.op = _OP_KDA_STEP
        a.i[0:18] = (
            qkv.data_ptr(), f.data_ptr(), b.data_ptr(), gate.data_ptr(), _i64_ptr(slots, "kda_step slots"),
            qkv.shape[0], _f32_ptr(conv_weight, "kda conv_weight"), _f32_ptr(conv_state, "kda conv_state"),
            conv_weight.shape[1], _f32_ptr(dt_bias, "kda dt_bias"), _f32_ptr(A_log, "kda A_log"),
            _f32_ptr(norm_weight, "kda norm"), _f32_ptr(state, "kda state"), S, H, D, y.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        a.f[0] = eps
        kept = (qkv, f, b, gate, slots, conv_weight, conv_state, dt_bias, A_log, norm_weight, state, y)
        self._run(a, addr, "kda_step", *kept)
        return y

    def kda_prefill(
        self,
        qkv: torch.Tensor,
        f: torch.Tensor,
        b: torch.Tensor,
        gate: torch.Tensor,
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
        eps: float,
        chunk_size: int,
    ) -> torch.Tensor:
        Bsz = len(query_lens)
        if not (qkv.is_cpu and slots.is_cpu):
            raise UnsupportedInput("kda_prefill: CPU tensors only")
        if slots.numel() != Bsz or len(fresh) != Bsz or sum(query_lens) != qkv.shape[0]:
            raise ValueError(
                f"kda_prefill: {qkv.shape[0]} rows, query_lens {list(query_lens)}, {slots.numel()} slots and "
                f"{len(fresh)} fresh flags are inconsistent"
            )
        y = self._kda_check("kda_prefill", qkv, f, b, gate, conv_weight, conv_state, state)
        starts = accumulate(query_lens[:-1], initial=0)
        seqs = torch.tensor(
            list(zip(starts, query_lens, slots.tolist(), (int(x) for x in fresh), strict=True)),
            dtype=torch.int64,
        ).reshape(Bsz, 4)
        cuts = torch.tensor(list(saves), dtype=torch.int64).reshape(len(saves), 3)
        S, H, D, _ = state.shape
        a, addr = self._args()
        a.op = _OP_KDA_PREFILL
        a.i[0:21] = (
            qkv.data_ptr(), f.data_ptr(), b.data_ptr(), gate.data_ptr(), seqs.data_ptr(), Bsz,
            cuts.data_ptr(), len(saves), _f32_ptr(conv_weight, "kda conv_weight"),
            _f32_ptr(conv_state, "kda conv_state"), conv_weight.shape[1], _f32_ptr(dt_bias, "kda dt_bias"),
            _f32_ptr(A_log, "kda A_log"), _f32_ptr(norm_weight, "kda norm"), _f32_ptr(state, "kda state"),
            S, H, D, chunk_size, y.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        a.f[0] = eps
        kept = (qkv, f, b, gate, seqs, cuts, conv_weight, conv_state, dt_bias, A_log, norm_weight, state, y)
        self._run(a, addr, "kda_prefill", *kept)
        return y

    def _kda_check(
        self,
        name: str,
        qkv: torch.Tensor,
        f: torch.Tensor,
        b: torch.Tensor,
        gate: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_state: torch.Tensor,
        state: torch.Tensor,
    ) -> torch.Tensor:
        """Shapes and layouts both KDA kernels take; returns the output y [T, H·D] to fill."""
        S, H, D, Dv = state.shape
        C, K = conv_weight.shape
        T, W = qkv.shape[0], H * D
        if (
            Dv != D
            or C != 3 * W
            or qkv.shape != (T, C)
            or f.shape != (T, W)
            or gate.shape != (T, W)
            or b.shape != (T, H)
            or conv_state.shape != (S, C, K - 1)
        ):
            raise ValueError(
                f"{name}: qkv {list(qkv.shape)}, f {list(f.shape)}, b {list(b.shape)}, gate "
                f"{list(gate.shape)}, conv_weight {list(conv_weight.shape)}, conv_state "
                f"{list(conv_state.shape)}, state {list(state.shape)} are inconsistent"
            )
        for t, what in ((qkv, "qkv"), (f, "f"), (b, "b"), (gate, "gate")):
            if t.dtype is not _F32 or not t.is_cpu or not t.is_contiguous():
                raise UnsupportedInput(f"{name}: {what} must be contiguous fp32 CPU rows, found {t.dtype}")
        return torch.empty(T, W, dtype=_F32)
