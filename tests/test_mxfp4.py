"""The `mxfp4` weight kind (kernels/mxfp4.py, csrc/linear_mxfp4.c) against its references, on every ISA build
this CPU runs (tests/conftest.py's `lib`):

- its values are gguf-py's (`gguf.quants` MXFP4: ggml's kvalues_mxfp4 under 2^(e − 128)), in torch and in C
  (csrc/dequantize.c); gguf-py's quantizer reproduced byte for byte; HF's nibble order re-laid to GGUF's
  giving transformers' values;
- the linear kernel equals the exact emulation of its integer algorithm (`int8_dot_reference`) to fp32
  rounding, and the float reference (dequantized weight · x) within the 8-bit activation rounding bound
  of test_kernels.py — decode tiles and the packed prefill path, epilogues, a row table, groups whose scales
  are no float16 (the tiles then) —, the same bits on every build, and a row's bits never depending on its
  batch;
- held at 17 bytes per 32 values (4.25 bits).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from blazr.kernels import mxfp4, ops
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize, row_bytes
from blazr.loading import mxfp4 as hf_mxfp4
from tests.test_kernels import EPILOGUES, _act_error_bound, _check_linear, _epilogue, gamma


def _weight(n: int, k: int, seed: int, lo: int = 118, hi: int = 136) -> QuantizedWeight:
    raw = mxfp4.random_blocks(n, k, torch.Generator().manual_seed(seed), lo, hi)
    return QuantizedWeight.from_blocks("mxfp4", raw, n, k)


def test_values_equal_gguf_py(lib: ops.Kernels) -> None:
    """Every code under every scale byte (0 and 1: ggml's subnormal halves; 255), in torch and in C."""
    g = torch.Generator().manual_seed(0)
    raw = mxfp4.random_blocks(256, 64, g)
    raw.view(-1, 17)[:256, 0] = torch.arange(256, dtype=torch.uint8)
    want = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.MXFP4).copy())
    got = mxfp4.dequantize_blocks(raw).reshape(256, 64)
    assert torch.equal(got, want.reshape(256, 64))
    assert torch.equal(lib.dequantize_blocks("mxfp4", raw, 256, 64), got)
    assert torch.equal(dequantize(QuantizedWeight.from_blocks("mxfp4", raw, 256, 64)), got)
    # the doubled values under the halved scale are the OCP values: e2m1 · 2^(e − 127)
    codes = mxfp4.codes(raw.view(-1, 17)).long()
    e = raw.view(-1, 17)[:, :1].to(torch.int32)
    ocp = torch.ldexp(torch.tensor(hf_mxfp4.E2M1)[codes], e - 127)
    normal = (e[:, 0] >= 2) & (e[:, 0] < 255)
    assert torch.equal(got.reshape(-1, 32)[normal], ocp[normal])


def test_quantize_equals_gguf_py() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 96, generator=g) * torch.logspace(-3, 2, 96)
    w[0, :32] = 0  # a zero block
    want = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.MXFP4)
    got = quantize(w, "mxfp4")
    assert got.kind == "mxfp4" and torch.equal(got.data, torch.from_numpy(np.ascontiguousarray(want)))


def test_hf_packing_relaid_as_gguf() -> None:
    """HF's `*_blocks` / `*_scales` re-laid as GGUF blocks hold transformers' values (loading/mxfp4.py's
    dequantization of HF's packing), 17 bytes per 32 values."""
    g = torch.Generator().manual_seed(2)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 136, (3, 10, 4), dtype=torch.uint8, generator=g)
    raw = mxfp4.from_hf(blocks, scales)
    assert raw.shape == (3, 10, 4 * 17)
    got = mxfp4.dequantize_blocks(raw).reshape(3, 10, 128)
    assert torch.equal(got, hf_mxfp4.dequantize_hf(blocks, scales))
    with pytest.raises(ValueError, match="do not pair"):
        mxfp4.from_hf(blocks, scales[..., :3])


def test_weight_is_ggml_bytes() -> None:
    """An mxfp4 weight keeps the bytes it is given ([N, K/32 · 17], a view): 4.25 bits a value."""
    raw = mxfp4.random_blocks(37, 256, torch.Generator().manual_seed(3))
    qw = QuantizedWeight.from_ggml("MXFP4", raw.reshape(-1), 37, 256)
    assert qw.kind == "mxfp4" and qw.data.data_ptr() == raw.data_ptr() and qw.ggml_blocks() is qw.data
    assert row_bytes("mxfp4", 256) == 8 * 17 and qw.nbytes * 8 / (37 * 256) == 4.25
    with pytest.raises(ValueError, match=r"expected torch\.uint8 \[37, 136\]"):
        QuantizedWeight("mxfp4", raw[:, :-1].contiguous(), 37, 256)


@pytest.mark.parametrize("M", [1, 3, 16, 40])
@pytest.mark.parametrize(("N", "K"), [(67, 576), (130, 1536), (6, 96)])
def test_linear_mxfp4(lib: ops.Kernels, M: int, N: int, K: int) -> None:
    """The kernel against the exact emulation (fp32 rounding) and the float reference (+ activation
    rounding), with each epilogue; 16 and 40 rows run the packed prefill path."""
    g = torch.Generator().manual_seed(M * 1000 + N)
    qw = _weight(N, K, seed=N)
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
        qn = qw if rows == N else QuantizedWeight("mxfp4", qw.data[:rows].contiguous(), rows, K)
        out = residual.clone() if residual is not None else None
        y = lib.linear(x, qn, bias, out, swiglu=swiglu, out=out)
        _check_linear(y, exact[:, :rows], fp32_err[:, :rows], bias, residual, swiglu)
        err = fp32_err[:, :rows] + act_err[:, :rows] + ref_err[:, :rows]
        _check_linear(y, ref[:, :rows], err, bias, residual, swiglu)
        if i == 0:
            _check_linear(ops.linear_reference(x, qn), ref, ref_err + 1e-30, None, None, False)


def test_same_bits_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """Exact integer dots, then the same fp32 operations in order: VNNI, AVX2 and scalar builds agree bit for
    bit, awkward activations included (a zero block, ties at ±amax, huge and tiny values). (Not SwiGLU: its
    silu's exp differs by build in the shared epilogue, blazr_kernels.h's blz_epilogue16.)"""
    g = torch.Generator().manual_seed(7)
    qw = _weight(53, 576, seed=4, lo=100, hi=150)  # some scales no float16: tiles among packed groups
    for M in (1, 5, 17, 40):
        x = torch.randn(M, 576, generator=g) * torch.logspace(-3, 2, 576)
        x[0, :32] = 0
        x[-1, 32:64] = torch.tensor([3.0, -3.0] * 16)
        bias = torch.randn(53, generator=g)
        assert torch.equal(native.linear(x, qw, bias), other_build.linear(x, qw, bias)), M


@pytest.mark.parametrize(("lo", "hi"), [(118, 136), (96, 160)])
def test_batch_rows_are_independent(lib: ops.Kernels, lo: int, hi: int) -> None:
    """A batched call equals one call per row, bit for bit: the decode tiles and the packed groups compute the
    same operations — also where a group's scales are no float16 (96-160: those groups run the tiles)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(37, 512, generator=g)
    qw = _weight(45, 512, seed=5, lo=lo, hi=hi)
    rows = torch.cat([lib.linear(x[i : i + 1], qw) for i in range(len(x))])
    for lo_, hi_ in ((0, 37), (5, 12), (3, 19), (13, 37)):
        assert torch.equal(lib.linear(x[lo_:hi_], qw), rows[lo_:hi_]), (lo_, hi_)
    gate_up = QuantizedWeight("mxfp4", qw.data[:44].contiguous(), 44, 512)
    rows = torch.cat([lib.linear(x[i : i + 1], gate_up, swiglu=True) for i in range(len(x))])
    assert torch.equal(lib.linear(x, gate_up, swiglu=True), rows)


def test_row_table_reads_rows_where_they_lie(native: ops.Kernels) -> None:
    """A MappedWeight (rows listed by address, here in another order) gives the bits of its rows gathered."""
    qw = _weight(40, 256, seed=6)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    rows = qw.data.data_ptr() + order * row_bytes("mxfp4", 256)
    mapped = MappedWeight("mxfp4", rows, qw.data, 40, 256)
    gathered = QuantizedWeight("mxfp4", qw.data[order].contiguous(), 40, 256)
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(2))
    for M in (1, 20):
        assert torch.equal(native.linear(x[:M], mapped), native.linear(x[:M], gathered)), M
