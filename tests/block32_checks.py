"""The checks every 32-value-block weight kind run as stored by csrc/linear_b32.c (mxfp4, q5_0) passes: the
kernel against its exact emulation and the float reference, the same bits on every ISA build, batched rows
equal to one row at a time, the one-row decode path (streams of tiles with unsigned values) equal to the
tiled and packed paths at every stream count, rows read through a row table equal to those rows gathered.
The kinds' test files (tests/test_mxfp4.py, tests/test_q5_0.py) call them with weights of their own."""

from __future__ import annotations

import torch

from blazr.kernels import ops, tuning
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight, dequantize, row_bytes
from tests.kernel_checks import EPILOGUES, _act_error_bound, _check_linear, _epilogue, _knob_values, gamma
from tests.threads import intra_op_threads


def _rows(qw: QuantizedWeight, n: int) -> QuantizedWeight:
    """The first n rows of qw as a weight of its own."""
    return (
        qw if n == qw.out_features else QuantizedWeight(qw.kind, qw.data[:n].contiguous(), n, qw.in_features)
    )


def check_linear(lib: ops.Kernels, qw: QuantizedWeight, M: int, g: torch.Generator) -> None:
    """The kernel against the exact emulation (fp32 rounding) and the float reference (+ activation
    rounding), with each epilogue (3 and 16 rows); 16 and more rows run the packed prefill path."""
    N, K = qw.out_features, qw.in_features
    wd = dequantize(qw)
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)
    exact, mag = ops.int8_dot_reference(x, qw)
    fp32_err = gamma(K // 32 + 40) * mag
    act_err = _act_error_bound(x, wd)
    ref = x.double() @ wd.double().T
    ref_err = gamma(K) * (x.abs().double() @ wd.abs().double().T)
    for i, name in enumerate(EPILOGUES):
        if name != "plain" and M not in (3, 16):
            continue
        rows = N - (N % 2 if name == "swiglu" else 0)
        bias, residual, swiglu = _epilogue(name, M, rows, g)
        qn = _rows(qw, rows)
        out = residual.clone() if residual is not None else None
        y = lib.linear(x, qn, bias, out, swiglu=swiglu, out=out)
        _check_linear(y, exact[:, :rows], fp32_err[:, :rows], bias, residual, swiglu)
        err = fp32_err[:, :rows] + act_err[:, :rows] + ref_err[:, :rows]
        _check_linear(y, ref[:, :rows], err, bias, residual, swiglu)
        if i == 0:
            _check_linear(ops.linear_reference(x, qn), ref, ref_err + 1e-30, None, None, False)


def check_same_bits(native: ops.Kernels, other: ops.Kernels, qw: QuantizedWeight, g: torch.Generator) -> None:
    """Exact integer dots, then the same fp32 operations in order: two builds agree bit for bit, awkward
    activations included (a zero block, ties at ±amax, huge and tiny values). (Not SwiGLU: its silu's exp
    differs by build in the shared epilogue, blazr_kernels.h's blz_epilogue16.)"""
    K = qw.in_features
    for M in (1, 5, 17, 40):
        x = torch.randn(M, K, generator=g) * torch.logspace(-3, 2, K)
        x[0, :32] = 0
        x[-1, 32:64] = torch.tensor([3.0, -3.0] * 16)
        bias = torch.randn(qw.out_features, generator=g)
        assert torch.equal(native.linear(x, qw, bias), other.linear(x, qw, bias)), M


def check_batch_rows(lib: ops.Kernels, qw: QuantizedWeight, g: torch.Generator) -> None:
    """A batched call equals one call per row, bit for bit: the decode tiles and the packed groups compute the
    same operations (SwiGLU too, over qw's first 44 rows)."""
    x = torch.randn(37, qw.in_features, generator=g)
    rows = torch.cat([lib.linear(x[i : i + 1], qw) for i in range(len(x))])
    for lo, hi in ((0, 37), (5, 12), (3, 19), (13, 37)):
        assert torch.equal(lib.linear(x[lo:hi], qw), rows[lo:hi]), (lo, hi)
    gate_up = _rows(qw, 44)
    rows = torch.cat([lib.linear(x[i : i + 1], gate_up, swiglu=True) for i in range(len(x))])
    assert torch.equal(lib.linear(x, gate_up, swiglu=True), rows)


def check_one_row(lib: ops.Kernels, qw: QuantizedWeight, g: torch.Generator) -> None:
    """One activation row (M = 1: linear_b32.c's b32_streams, unsigned values and the −c·Σqx correction)
    gives, bit for bit, what the same row gets inside a decode batch (the signed 8-row tiles, M = 3) and a
    prefill call (the packed groups, M = 40: MXFP4 packs from 28 rows, Q5_0 from 16): at output counts that
    leave tiles short and streams empty, every epilogue (bias + residual, SwiGLU), every stream count this
    build takes (knob streams_b32), one thread and two."""
    K = qw.in_features
    x = torch.randn(40, K, generator=g) * torch.logspace(-2, 1, K)
    x[1, :32] = 0  # a zero block: Σqx = 0
    x[2, 32:64] = torch.tensor([3.0, -3.0] * 16)  # ties at ±amax
    assert "streams_b32" in {k.name for k in tuning.KNOBS}
    for n in sorted({1, 7, 9, 40, qw.out_features}):
        qn = _rows(qw, min(n, qw.out_features))
        N = qn.out_features
        bias, residual = torch.randn(N, generator=g), torch.randn(40, N, generator=g)
        tiled = lib.linear(x[:3], qn, bias, residual[:3].clone())
        packed = lib.linear(x, qn, bias, residual.clone())
        swiglu = lib.linear(x[:3], qn, swiglu=True) if N % 2 == 0 else None
        for streams in _knob_values(lib, "streams_b32"):
            for threads in (1, 2):
                with lib.tuned(streams_b32=streams), intra_op_threads(threads):
                    for i in range(3):
                        one = lib.linear(x[i : i + 1], qn, bias, residual[i : i + 1].clone())
                        assert torch.equal(one, tiled[i : i + 1]), (N, streams, threads, i)
                        assert torch.equal(one, packed[i : i + 1]), (N, streams, threads, i)
                        if swiglu is not None:
                            got = lib.linear(x[i : i + 1], qn, swiglu=True)
                            assert torch.equal(got, swiglu[i : i + 1]), (N, streams, threads, i, "swiglu")


def check_row_table(native: ops.Kernels, qw: QuantizedWeight) -> None:
    """A MappedWeight (qw's rows listed by address, in another order) gives the bits of its rows gathered."""
    N, K = qw.out_features, qw.in_features
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    rows = qw.data.data_ptr() + order * row_bytes(qw.kind, K)
    mapped = MappedWeight(qw.kind, rows, qw.data, N, K)
    gathered = QuantizedWeight(qw.kind, qw.data[order].contiguous(), N, K)
    x = torch.randn(20, K, generator=torch.Generator().manual_seed(2))
    for M in (1, 20):
        assert torch.equal(native.linear(x[:M], mapped), native.linear(x[:M], gathered)), M
