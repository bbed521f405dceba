"""The `mxfp4` weight kind (kernels/mxfp4.py, csrc/linear_mxfp4.c) against its references, on every ISA build
this CPU runs (tests/conftest.py's `lib`):

- its values are gguf-py's (`gguf.quants` MXFP4: ggml's kvalues_mxfp4 under 2^(e − 128)), in torch and in C
  (csrc/dequantize.c); gguf-py's quantizer reproduced byte for byte; HF's nibble order re-laid to GGUF's
  giving transformers' values;
- the linear kernel equals the exact emulation of its integer algorithm (`int8_dot_reference`) to fp32
  rounding, and the float reference (dequantized weight · x) within the 8-bit activation rounding bound
  of kernel_checks.py — decode tiles and the packed prefill path, epilogues, a row table, groups whose scales
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
from blazr.kernels.quant import QuantizedWeight, dequantize, quantize, row_bytes
from blazr.loading import mxfp4 as hf_mxfp4
from tests.block32_checks import (
    check_batch_rows,
    check_linear,
    check_one_row,
    check_row_table,
    check_same_bits,
)


def _weight(n: int, k: int, seed: int, lo: int = 118, hi: int = 136) -> QuantizedWeight:
    raw = mxfp4.random_blocks(n, k, torch.Generator().manual_seed(seed), lo, hi)
    return QuantizedWeight.from_blocks("mxfp4", raw, n, k)


def test_values_equal_gguf_py(lib: ops.Kernels) -> None:
    """Every code under every scale byte (0 and 1: ggml's subnormal halves; 255), in torch and in C."""
    g = torch.Generator().manual_seed(0)
    raw = mxfp4.random_blocks(256, 64, g)
    raw.view(-1, 17)[:256, 0] = torch.arange(256, dtype=torch.uint8)
    with np.errstate(over="ignore"):  # the largest scale bytes overflow float32: inf in gguf-py, as in C
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
    """The kernel against its exact emulation and the float reference, each epilogue (block32_checks)."""
    check_linear(lib, _weight(N, K, seed=N), M, torch.Generator().manual_seed(M * 1000 + N))


def test_same_bits_on_every_build(native: ops.Kernels, other_build: ops.Kernels) -> None:
    """VNNI, AVX2 and scalar builds agree bit for bit (block32_checks.check_same_bits); some scales no
    float16 here: tiles among packed groups."""
    check_same_bits(
        native, other_build, _weight(53, 576, seed=4, lo=100, hi=150), torch.Generator().manual_seed(7)
    )


@pytest.mark.parametrize(("lo", "hi"), [(118, 136), (96, 160)])
def test_batch_rows_are_independent(lib: ops.Kernels, lo: int, hi: int) -> None:
    """A batched call equals one call per row, bit for bit — also where a group's scales are no float16
    (96-160: those groups run the tiles) (block32_checks.check_batch_rows)."""
    check_batch_rows(lib, _weight(45, 512, seed=5, lo=lo, hi=hi), torch.Generator().manual_seed(11))


def test_one_row_path_equals_tiles_and_groups(lib: ops.Kernels) -> None:
    """The one-row decode path gives the bits of the tiled and packed paths, every stream count, one thread
    and two, every epilogue (block32_checks.check_one_row)."""
    check_one_row(lib, _weight(83, 640, seed=8), torch.Generator().manual_seed(13))


def test_row_table_reads_rows_where_they_lie(native: ops.Kernels) -> None:
    """Rows read through a row table give the bits of those rows gathered (block32_checks.check_row_table)."""
    check_row_table(native, _weight(40, 256, seed=6))
