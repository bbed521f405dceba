"""Q8_0 as stored against fp32 activations (`exact_x`, csrc/linear_q8xf.c: an output head's form) on every
ISA build: within fp32 rounding of the float model's W·x (the int8 kernel is not, by its activation
rounding), every epilogue, rows independent of the batch, the same bits on the SIMD builds, weights read
through a row table, and exact_x refused for kinds that do not offer it."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize
from tests.kernel_checks import EPILOGUES, _check_linear, _epilogue, _weights, gamma


def _q8g(n: int, k: int, seed: int) -> QuantizedWeight:
    """A Q8_0 weight [n, k] as a GGUF stores it, with q = −128 in a few blocks (a file may hold it)."""
    blocks = quantize(_weights(n, k, seed), "q8_0").ggml_blocks().clone()
    blocks.view(n, k // 32, 34)[: min(n, 5), :3, 2:6] = 0x80
    return QuantizedWeight.from_blocks("q8_0g", blocks, n, k)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 17])
@pytest.mark.parametrize(("N", "K"), [(67, 576), (130, 1536), (6, 32)])
def test_exact_x_is_the_float_product(lib: ops.Kernels, M: int, N: int, K: int) -> None:
    """Within γ_K·|x|·|w| of the exact W·x on the dequantized weight (no activation rounding), with each
    epilogue; the int8 kernel on the same call is further than that bound (it rounds x)."""
    qw = _q8g(N, K, seed=N)
    wd = dequantize(qw)
    g = torch.Generator().manual_seed(M * 100 + K)
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, K)
    ref = x.double() @ wd.double().T
    err = gamma(K + 8) * (x.abs().double() @ wd.abs().double().T)
    for name in EPILOGUES:
        bias, residual, swiglu = _epilogue(name, M, N, g)
        if swiglu and N % 2:
            continue
        out = residual.clone() if residual is not None else None
        y = lib.linear(x, qw, bias, out, swiglu=swiglu, out=out, exact_x=True)
        assert out is None or y.data_ptr() == out.data_ptr()
        _check_linear(y, ref, err, bias, residual, swiglu)
    if K >= 576:
        rounded = lib.linear(x, qw)
        assert bool(((rounded.double() - ref).abs() > err).any())  # the int8 form is not within it
    _check_linear(ops.linear_reference(x, qw, exact_x=True), ref, err, None, None, False)


def test_rows_do_not_depend_on_the_batch(lib: ops.Kernels) -> None:
    """Every batch size 1..12 and 40 rows give each row the bits it gets alone."""
    qw = _q8g(83, 1024, seed=1)
    x = torch.randn(40, 1024, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([lib.linear(x[i : i + 1], qw, exact_x=True) for i in range(len(x))])
    for M in range(1, 13):
        assert torch.equal(lib.linear(x[3 : 3 + M], qw, exact_x=True), alone[3 : 3 + M]), M
    assert torch.equal(lib.linear(x, qw, exact_x=True), alone)


def test_same_bits_on_every_simd_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """AVX2 and AVX-512 sum each block's quarters in the same order: the same bits. (The scalar build keeps
    the quarters and the tree, with its own order inside a quarter: within rounding of the others.)"""
    qw = _q8g(53, 576, seed=7)
    g = torch.Generator().manual_seed(7)
    for M in (1, 3, 6):
        x = torch.randn(M, 576, generator=g) * torch.logspace(-3, 2, 576)
        bias = torch.randn(53, generator=g)
        want, got = native.linear(x, qw, bias, exact_x=True), other_build.linear(x, qw, bias, exact_x=True)
        if other_build.features:  # a SIMD build
            assert torch.equal(got, want), M
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_row_table_weight(lib: ops.Kernels) -> None:
    """A weight whose rows lie anywhere (a GGUF's tied head, read in place through a row table) gives the
    bits of the same rows back to back."""
    qw = _q8g(40, 640, seed=3)
    holder = qw.data.flip(0).contiguous()  # the rows in reverse order: row n at holder[39 - n]
    step = holder.shape[1]
    rows = holder.data_ptr() + step * torch.arange(39, -1, -1, dtype=torch.int64)
    mapped = MappedWeight("q8_0g", rows, holder, 40, 640)
    x = torch.randn(3, 640, generator=torch.Generator().manual_seed(4))
    assert torch.equal(lib.linear(x, mapped, exact_x=True), lib.linear(x, qw, exact_x=True))


def test_exact_x_refused_where_not_offered(native: ops.Kernels) -> None:
    """A kind without the fp32-activation form says so rather than rounding x anyway."""
    qw = quantize(_weights(8, 64), "q4_0")
    x = torch.randn(1, 64)
    for call in (native.linear, ops.linear_reference):
        with pytest.raises(ValueError, match="exact_x is not offered by kind q4_0"):
            call(x, qw, exact_x=True)
