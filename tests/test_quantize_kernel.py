"""The C quantizer (csrc/quantize.c, `Kernels.quantize_blocks`) against `quantize_reference` (torch) and
gguf's numpy quantizers (`gguf.quants.quantize`, ggml's reference rounding): the same bytes for Q8_0, Q4_0
and Q4_1, on random weights and edge cases (zero blocks, overflowing scales, exact halves, ties, tiny and
constant blocks), from f32, bf16 and f16, on the native and the portable (`generic`) builds; `quantize`
dispatches to it; `quantize_rows` (rows found by address) quantizes gathered rows the same way, also where
the threads map their outputs up front (a few MB); bad inputs are a ValueError."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from blazr.kernels import ops
from blazr.kernels.quant import (
    BLOCK_BYTES,
    BLOCK_KINDS,
    ROW_GROUP,
    pack_blocks_reference,
    quantize,
    unpack_blocks,
)
from blazr.kernels.quant_reference import quantize_reference
from blazr.loading.gguf import dequantize_reference
from tests.gguf_fixtures import random_blocks
from tests.threads import intra_op_threads

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1}  # fmt: skip
# N: one row, under a group, whole groups, a padded last group; K: one block, an odd count, a 1B-class width.
SHAPES = [(1, 32), (5, 96), (16, 64), (17, 32), (40, 256), (61, 2048)]


def _gguf(w: torch.Tensor, kind: str) -> torch.Tensor:
    """gguf's quantizer on the f32 values of `w`: ggml-ordered bytes [N, row_bytes]."""
    with np.errstate(over="ignore"):  # f16 scales of huge blocks overflow to inf, as in ggml
        data = gguf.quants.quantize(w.float().numpy(), GGML[kind])
    return torch.from_numpy(np.ascontiguousarray(data)).view(torch.uint8).reshape(w.shape[0], -1)


def _check(lib: ops.Kernels, w: torch.Tensor, kind: str) -> torch.Tensor:
    """C == torch reference (packed bytes) and their ggml order == gguf's bytes; returns the C bytes."""
    n, k = w.shape
    got = lib.quantize_blocks(kind, w)
    want = quantize_reference(w, kind)
    assert got.dtype == torch.uint8
    assert got.shape == want.data.shape == (-(-n // ROW_GROUP), ROW_GROUP * k // 32 * BLOCK_BYTES[kind])
    assert torch.equal(got, want.data)
    assert torch.equal(unpack_blocks(want), _gguf(w, kind))
    return got


def _edge_cases(k: int) -> torch.Tensor:
    """Rows of blocks that exercise the rounding rules (K = k, a multiple of 64)."""
    g = torch.Generator().manual_seed(3)
    rows = [
        torch.zeros(k),  # d = 0: id = 0, every quant 0 (q4_0: 8, q4_1: 0 with min 0)
        torch.full((k,), 0.25),  # a constant block: q4_1's d = 0
        torch.full((k,), -3.0),
        torch.randn(k, generator=g) * 1e30,  # f16 scales overflow to inf (q4_1's min too)
        torch.randn(k, generator=g) * 1e-30,  # f16 scales underflow to zero / subnormals
        torch.randn(k, generator=g) * 1e-6,  # subnormal f16 scales
        torch.randn(k, generator=g) * 6e4,  # near f16's largest finite
    ]
    halves = torch.arange(k, dtype=torch.float32) % 32 - 15.5  # x·id lands on exact halves
    halves[::32] = 127.0  # q8_0: d = 1, so x·id = x
    rows.append(halves)
    rows.append(halves / 8)
    ties = torch.randn(k, generator=g)
    ties[::32], ties[5::32] = 2.0, -2.0  # q4_0: the first of equal magnitudes sets the sign of d
    rows.append(ties)
    ties2 = ties.clone()
    ties2[::32], ties2[5::32] = -2.0, 2.0
    rows.append(ties2)
    mixed = torch.randn(k, generator=g)
    mixed[: k // 2] = 0  # zero blocks beside normal ones in one row
    rows.append(mixed)
    return torch.stack(rows)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_quantize_matches_reference_and_gguf(lib: ops.Kernels, kind: str, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 4
    _check(lib, w, kind)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_quantize_edge_cases(lib: ops.Kernels, kind: str) -> None:
    w = _edge_cases(128)
    got = _check(lib, w, kind)
    blocks = unpack_blocks(quantize_reference(w, kind)).view(w.shape[0], -1, BLOCK_BYTES[kind])
    assert (blocks[0, :, 0:2].contiguous().view(torch.float16) == 0).all()  # zeros: d = ±0 (q4_0: 0 / −8)
    assert (blocks[0, :, 2:] == (0x88 if kind == "q4_0" else 0)).all()
    assert (blocks[3, :, 0:2].view(torch.float16).isinf()).all()  # the overflowing scales really overflow
    assert got.shape[0] == 1


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_quantize_16_bit_inputs_equal_their_f32_copy(lib: ops.Kernels, kind: str) -> None:
    """bf16 / f16 weights are widened exactly: the same bytes as quantizing their f32 copy."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(33, 320, generator=g)
    for dtype in (torch.bfloat16, torch.float16):
        low = w.to(dtype)
        assert torch.equal(lib.quantize_blocks(kind, low), lib.quantize_blocks(kind, low.float()))
        assert torch.equal(lib.quantize_blocks(kind, low), quantize_reference(low, kind).data)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_quantize_equals_packing_ggufs_blocks(native: ops.Kernels, kind: str) -> None:
    """Quantizing straight into the packed layout = packing gguf's blocks (the two paths a layer can take)."""
    w = torch.randn(37, 96, generator=torch.Generator().manual_seed(6))
    want = pack_blocks_reference(kind, _gguf(w, kind), 37, 96)
    assert torch.equal(native.quantize_blocks(kind, w), want)


def test_quantize_empty_and_strided(native: ops.Kernels) -> None:
    assert native.quantize_blocks("q8_0", torch.zeros(0, 64)).shape == (0, ROW_GROUP * 2 * 34)
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(7))[::2, 32:96]  # a strided view
    assert not w.is_contiguous()
    assert torch.equal(native.quantize_blocks("q4_1", w), quantize_reference(w, "q4_1").data)


def test_quantize_dispatches_to_c(native: ops.Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize runs the kernel when the library is there, the reference when it is not (same bytes); float
    kinds and float64 weights never reach the kernel."""
    w, calls = torch.randn(17, 64, generator=torch.Generator().manual_seed(8)), []
    real = ops.Kernels.quantize_blocks

    def spy(self: ops.Kernels, kind: str, weight: torch.Tensor) -> torch.Tensor:
        calls.append(kind)
        return real(self, kind, weight)

    monkeypatch.setattr(ops.Kernels, "quantize_blocks", spy)
    got = quantize(w, "q8_0")
    assert calls == ["q8_0"] and got.kind == "q8_0" and (got.out_features, got.in_features) == (17, 64)
    assert torch.equal(quantize(w.double(), "q8_0").data, got.data)
    assert quantize(w, "bf16").kind == "bf16"
    assert calls == ["q8_0"]
    monkeypatch.setattr(ops, "kernels", lambda: None)
    assert torch.equal(quantize(w, "q8_0").data, got.data)
    assert calls == ["q8_0"]


@pytest.mark.parametrize("fn", ["c", "reference", "dispatch"])
def test_quantize_bad_inputs(native: ops.Kernels, fn: str) -> None:
    def run(w: torch.Tensor, kind: str) -> object:
        if fn == "c":
            return native.quantize_blocks(kind, w)
        return (quantize_reference if fn == "reference" else quantize)(w, kind)

    with pytest.raises(ValueError, match="in_features 48 is not a positive multiple of 32"):
        run(torch.zeros(4, 48), "q8_0")  # K not a multiple of 32: no block kind takes it
    with pytest.raises(ValueError, match="in_features 0 is not a positive multiple of 32"):
        run(torch.zeros(4, 0), "q4_1")
    with pytest.raises(ValueError, match="2-D weight"):
        run(torch.zeros(64), "q4_0")
    with pytest.raises(ValueError, match="kind 'q4_k'"):
        run(torch.zeros(4, 256), "q4_k")
    if fn == "c":
        with pytest.raises(ops.UnsupportedInput, match="f32 / bf16 / f16"):
            run(torch.zeros(4, 64, dtype=torch.float64), "q8_0")


@pytest.mark.parametrize("kind", BLOCK_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_rows_equals_quantizing_the_gathered_rows(
    lib: ops.Kernels, kind: str, dtype: torch.dtype
) -> None:
    """quantize_rows (each row by address: here shuffled, with repeats) = quantize_blocks of the rows
    gathered in that order."""
    n, k = 37, 320
    w = (torch.randn(n + 5, k, generator=torch.Generator().manual_seed(9)) * 2).to(dtype)
    order = torch.cat([torch.randperm(n + 5, generator=torch.Generator().manual_seed(1))[: n - 2],
                       torch.tensor([0, 0])])  # fmt: skip
    rows = w.data_ptr() + order * w.stride(0) * w.element_size()
    assert torch.equal(lib.quantize_rows(kind, rows, dtype, n, k), quantize_reference(w[order], kind).data)


def test_quantize_rows_bad_inputs(native: ops.Kernels) -> None:
    w = torch.zeros(4, 64)
    rows = w.data_ptr() + torch.arange(4) * 256
    with pytest.raises(ValueError, match=r"int64 CPU row addresses \[5\] expected"):
        native.quantize_rows("q8_0", rows, torch.float32, 5, 64)
    with pytest.raises(ValueError, match="positive multiple of 32"):
        native.quantize_rows("q8_0", rows, torch.float32, 4, 48)
    with pytest.raises(ops.UnsupportedInput, match="f32 / bf16 / f16 rows"):
        native.quantize_rows("q8_0", rows, torch.float64, 4, 64)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_dequantize_blocks_matches_torch_and_gguf(lib: ops.Kernels, qtype: str) -> None:
    """The C dequantizer (csrc/dequantize.c) = loading/gguf.py's torch dequantizers = gguf.quants.dequantize
    on random blocks (every quant bit pattern, scales with zeros and subnormals)."""
    n, k = 7, 512
    raw = torch.from_numpy(random_blocks(qtype, n * k, seed=12))
    got = lib.dequantize_blocks(qtype.lower(), raw, n, k)
    assert torch.equal(got, dequantize_reference(raw, qtype, (n, k)))
    want = gguf.quants.dequantize(raw.numpy().reshape(n, -1), gguf.GGMLQuantizationType[qtype])
    assert torch.equal(got, torch.from_numpy(np.asarray(want, dtype=np.float32)))
    with pytest.raises(ValueError, match="uint8 bytes"):
        lib.dequantize_blocks(qtype.lower(), raw[:-1], n, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_q8_0g_is_ggufs_q8_0_rows(lib: ops.Kernels, dtype: torch.dtype) -> None:
    """q8_0g (`--quantize int8`): the C quantizer writes gguf's Q8_0 blocks in ggml's own row order, from a
    whole weight or from rows by address (shuffled, with repeats); f32 edge-case rows included."""
    w = torch.randn(21, 128, generator=torch.Generator().manual_seed(4)) * 3
    w = torch.cat([_edge_cases(128), w]) if dtype == torch.float32 else w.to(dtype)
    want = _gguf(w, "q8_0")
    assert torch.equal(lib.quantize_blocks("q8_0g", w), want)
    order = torch.tensor([3, 0, 0, 20, 7])
    rows = w.data_ptr() + order * w.stride(0) * w.element_size()
    assert torch.equal(lib.quantize_rows("q8_0g", rows, dtype, 5, 128), want[order])


@pytest.mark.parametrize("kind", ["q8_0g", "q4_0"])
def test_quantize_large_outputs_mapped_up_front(native: ops.Kernels, kind: str) -> None:
    """Outputs of a few MB, where each of two threads first maps its share of the fresh output in one call
    (quantize.c's `populate`): the same bytes as the reference, from a whole weight and from rows by
    address."""
    w = (torch.randn(4096, 1024, generator=torch.Generator().manual_seed(11)) * 2).to(torch.bfloat16)
    want = _gguf(w, "q8_0") if kind == "q8_0g" else quantize_reference(w, kind).data
    with intra_op_threads(2):
        assert torch.equal(native.quantize_blocks(kind, w), want)
        rows = w.data_ptr() + torch.arange(4096) * w.stride(0) * w.element_size()
        assert torch.equal(native.quantize_rows(kind, rows, torch.bfloat16, 4096, 1024), want)
