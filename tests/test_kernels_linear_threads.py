"""How the linear kernels split their work changes no bit: every value of a host-tuning knob
(kernels/tuning.py), decode linears' threads balancing their shares, the float prefill GEMM's passes over x
rows and its lanes path for a few rows — on every ISA build (`lib`, tests/conftest.py) or the native one.
Moved out of tests/test_kernels.py."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import pytest
import torch

from blazr.kernels import coded, ops, tuning
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import FLOAT_KINDS, K_KINDS, QuantizedWeight, dequantize, quantize
from tests.kernel_checks import EPILOGUES, LINEAR_BLOCK_KINDS, _epilogue, _knob_values, _weights, gamma
from tests.threads import intra_op_threads


@pytest.mark.parametrize("knob", [k.name for k in tuning.KNOBS])
@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS])
def test_tuning_knobs_change_no_bit(lib: ops.Kernels, knob: str, kind: str) -> None:
    """Every value of a host-tuning knob (the variants kernels/tuning.py picks per CPU: weight streams per
    thread, K-quant one-row sums in 256- or 512-bit registers) gives the bits of the default, for one and a
    few x rows, with bias + residual and as SwiGLU, Q8_0 as stored with x kept fp32 too, on one thread and
    two, at sizes that leave streams short or empty (float kinds: a K past the last full vector too) — so a
    host's choice changes the speed and nothing else."""
    g = torch.Generator().manual_seed(21)

    def calls(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor, residual: torch.Tensor) -> list:
        out = [
            lib.linear(x[:1], qw),
            lib.linear(x, qw),
            lib.linear(x[:1], qw, bias, residual[:1].clone()),
            lib.linear(x[:1], qw, swiglu=True),
        ]
        if kind == "q8_0g":  # the output head's form (csrc/linear_q8xf.c)
            out += [lib.linear(x[:1], qw, exact_x=True), lib.linear(x[:1], qw, swiglu=True, exact_x=True)]
        return out

    shapes = ((40, 512), (1000, 1024), *(((30, 1000),) if kind in FLOAT_KINDS else ()))
    for N, K in shapes:
        w = random_kquant(kind, N, K, g) if kind in K_KINDS else quantize(torch.randn(N, K), kind)
        x, bias, residual = (torch.randn(*s, generator=g) for s in ((3, K), (N,), (3, N)))
        args = (x, w, bias, residual)
        for threads in (1, 2):
            with intra_op_threads(threads):
                want = calls(*args)
                for v in _knob_values(lib, knob):
                    with lib.tuned(**{knob: v}):
                        got = calls(*args)
                    for a, b in zip(got, want, strict=True):
                        assert torch.equal(a, b), (N, K, knob, v, threads)


@contextlib.contextmanager
def _held_thread(native: ops.Kernels, t: int) -> Iterator[list[int]]:
    """Hold thread t of every balanced decode linear until its team-mates are done with their own steps
    (csrc's blz_set_walk_hold), so they take all of t's; yields a list that gets the runs they took."""
    hold = native.lib.blz_set_walk_hold
    hold.argtypes, hold.restype = [ctypes.c_int], ctypes.c_int64
    hold(t)
    taken: list[int] = []
    try:
        yield taken
    finally:
        taken.append(hold(-1))


def _decode_calls(
    native: ops.Kernels, x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor, residual: torch.Tensor
) -> list[torch.Tensor]:
    """One decode linear plain, with bias and residual, and as SwiGLU (Q8_0 as stored: x kept fp32 too)."""
    calls = [
        native.linear(x, qw),
        native.linear(x, qw, bias, residual.clone()),
        native.linear(x, qw, swiglu=True),
    ]
    if qw.kind == "q8_0g":
        calls.append(native.linear(x, qw, exact_x=True))
        calls.append(native.linear(x, qw, bias, residual.clone(), exact_x=True))
    return calls


@pytest.mark.parametrize(
    "kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS, "q5_0", "mxfp4", "bf16z", "f32z"]
)
def test_decode_linears_balance_threads_bit_for_bit(native: ops.Kernels, kind: str) -> None:
    """A decode linear's threads balance their shares (csrc's blz_walk_t: each walks its own block's steps
    from the front, then takes what is left of the others' from the back). With one thread held until the
    others are done, so that they compute all of its rows — thread 0 or 1 of 2, thread 1 of 3 —, every
    output keeps the bits of the one-thread call, with each epilogue and SwiGLU (f16 and bf16 at 3 x rows on
    AVX-512 builds, whose float walkers stream up to 8), at sizes that leave parts short. The streams (and so
    the balancing) are built into AVX2 builds and up (the float kinds' at one x row there); elsewhere no
    thread takes another's rows and the bits are still the one-thread bits."""
    walks = "avx2" in native.features
    rows = 3 if kind in ("f16", "bf16") and "avx512" in native.features else 1
    g = torch.Generator().manual_seed(12)
    K = 2048  # 38 rows × K: just enough work for the kernels to use 2 threads
    for N in (38, 136, 1000):
        if kind in K_KINDS:
            qw = random_kquant(kind, N, K, g)
        elif kind in coded.BASE_OF:
            made = coded.pack(quantize(torch.randn(N, K, generator=g) * 0.02, coded.BASE_OF[kind]))
            assert made is not None
            qw = made
        else:
            qw = quantize(torch.randn(N, K, generator=g), kind)
        x = torch.randn(rows, K, generator=g)
        bias, residual = torch.randn(N, generator=g), torch.randn(x.shape[0], N, generator=g)
        with intra_op_threads(1):
            alone = _decode_calls(native, x, qw, bias, residual)
        for threads, held in ((2, 0), (2, 1), (3, 1)):
            with intra_op_threads(threads), _held_thread(native, held) as taken:
                got = _decode_calls(native, x, qw, bias, residual)
            assert (taken[0] > 0) == walks, (N, threads, held, taken)  # the held thread's steps were taken
            for a, b in zip(got, alone, strict=True):
                assert torch.equal(a, b), (N, threads, held)


@pytest.mark.parametrize("shape", ["passes", "groups"])
@pytest.mark.parametrize("kind", ["f16", "bf16", "f32", "bf16z"])
def test_prefill_gemm_rows_in_passes(lib: ops.Kernels, kind: str, shape: str) -> None:
    """The float prefill GEMM (gemm_float.c) cuts its work three ways, and a row's bits depend on none of
    them, with every epilogue: at a long K it runs the x rows in passes of equal rows (up to ~8 MB of packed x
    each, and a quarter of the L3: 700 rows at K = 8192 are 3 passes or more); each thread walks its output
    blocks a group of panels at a time (8 on AVX2: 8 blocks, or 4 and their SwiGLU up rows), the x rows in
    blocks of 96 (AVX2) under each group — 300 outputs (150 SwiGLU) are groups whole and cut short on each of
    two threads, 250 rows three x blocks; one thread and two; coded rows (bf16z) decoded a group at a time.
    The call agrees with the exact product. Every window has more than 16 rows; some hold a pass's or a
    block's edge."""
    K, N, M = (8192, 38, 700) if shape == "passes" else (1024, 300, 250)
    g = torch.Generator().manual_seed(3)
    w = _weights(N, K, seed=5)
    qw = coded.pack(quantize(w * 0.02, "bf16")) if kind == "bf16z" else quantize(w, kind)
    assert qw is not None
    x = torch.randn(M, K, generator=g)
    xk = x.double()
    windows = ((0, 17), (3, 131), (120, 140), (1, M), (230, 250), (470, M)) if shape == "passes" else (
        (0, 17), (3, 131), (90, 110), (1, M), (180, 200), (191, M))  # fmt: skip
    for name in EPILOGUES:
        bias, residual, swiglu = _epilogue(name, M, N, g)
        whole = lib.linear(x, qw, bias, residual, swiglu=swiglu, prefill=True)
        for nt, (lo, hi) in zip((2, 1) * 3, windows, strict=True):
            res = None if residual is None else residual[lo:hi]
            with intra_op_threads(nt):
                part = lib.linear(x[lo:hi], qw, bias, res, swiglu=swiglu, prefill=True)
            assert torch.equal(part, whole[lo:hi]), (name, lo, hi, nt)
        if name == "plain":
            wk = dequantize(qw).double()
            exact, scale = xk @ wk.T, xk.abs() @ wk.abs().T
            assert bool(((whole.double() - exact).abs() <= gamma(K + 8) * scale).all())


@pytest.mark.parametrize("kind", ["f16", "f32"])
def test_gemm_of_a_few_rows_sums_as_the_panel(lib: ops.Kernels, kind: str) -> None:
    """13-16 x rows of a float GEMM call (f16 batched decode, f32 prefill) run with the x rows in a vector's
    lanes on AVX-512 hosts (gemm_float.c `lanes_gemm`), where more rows take the panel GEMM: the same sums,
    so each row has the bits it gets in a 20-row call — K with a tail of a 16-column step and of a 128-column
    block, output blocks of 24 (SwiGLU 12) cut short, every epilogue, one thread and two — and the call
    agrees with the exact product."""
    g = torch.Generator().manual_seed(17)
    for N, K in ((38, 1000), (48, 256), (6, 40), (62, 130)):
        qw = quantize(_weights(N, K, seed=N), kind)
        x = torch.randn(20, K, generator=g)
        for name in EPILOGUES:
            bias, residual, swiglu = _epilogue(name, 20, N, g)
            whole = lib.linear(x, qw, bias, residual, swiglu=swiglu, prefill=True)
            for M, nt in ((13, 2), (14, 1), (15, 2), (16, 1), (16, 2)):
                res = None if residual is None else residual[:M]
                with intra_op_threads(nt):
                    part = lib.linear(x[:M], qw, bias, res, swiglu=swiglu, prefill=True)
                assert torch.equal(part, whole[:M]), (N, K, name, M, nt)
            if name == "plain":
                exact, scale = x.double() @ qw.data.double().T, x.double().abs() @ qw.data.double().abs().T
                assert bool(((whole[:16].double() - exact[:16]).abs() <= gamma(K + 8) * scale[:16]).all())
