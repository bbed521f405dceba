"""The C repack of ggml-ordered blocks (csrc/pack.c, `Kernels.pack_blocks`) against `pack_blocks_reference`:
the same bytes, padding rows included, on the native and the portable (`generic`) builds; `pack_blocks`
dispatches to it; `unpack_blocks` undoes it; `pack_rows` (rows found by address) packs gathered rows the
same way; `gather_rows` moves rows found by address as they are (also where the threads map MB-sized
outputs up front); bad sizes are a ValueError."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops
from blazr.kernels.quant import (
    BLOCK_BYTES,
    BLOCK_KINDS,
    ROW_GROUP,
    QuantizedWeight,
    pack_blocks,
    pack_blocks_reference,
    unpack_blocks,
)
from tests.threads import intra_op_threads

# N: one row, under a group, whole groups, a padded last group; K: one block, an odd count, a 1B-class width.
SHAPES = [(1, 32), (5, 96), (16, 64), (17, 32), (40, 256), (61, 2048)]


def _blocks(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random bytes of an [n, k] weight in ggml order: every quant and scale bit pattern (packing moves bytes;
    it never reads them as numbers)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, k // 32 * BLOCK_BYTES[kind]), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_pack_matches_reference(lib: ops.Kernels, kind: str, n: int, k: int) -> None:
    blocks = _blocks(kind, n, k)
    want = pack_blocks_reference(kind, blocks, n, k)
    got = lib.pack_blocks(kind, blocks, n, k)
    assert got.dtype == torch.uint8
    assert got.shape == want.shape == (-(-n // ROW_GROUP), ROW_GROUP * blocks.shape[1])
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_pack_padding_rows(lib: ops.Kernels, kind: str) -> None:
    """The last group's padding rows: zero scales (and mins), zero quants — stored + 128 for q8_0."""
    n, k = 19, 64
    got = lib.pack_blocks(kind, _blocks(kind, n, k), n, k)
    # a copy of the weight with the padding rows made real (zero blocks) packs to the same bytes
    zero_rows = torch.zeros(32 - n, k // 32 * BLOCK_BYTES[kind], dtype=torch.uint8)
    full = torch.cat([_blocks(kind, n, k), zero_rows])
    assert torch.equal(got, lib.pack_blocks(kind, full, 32, k))
    header = 64 if kind == "q4_1" else 32
    tiles = got[1].view(k // 32, -1)
    pad_scales = tiles[:, :header].view(k // 32, -1, ROW_GROUP, 2)[:, :, n - ROW_GROUP :]
    assert not pad_scales.any()
    quants = tiles[:, header:].reshape(k // 32, -1, ROW_GROUP, 4)[:, :, n - ROW_GROUP :]
    assert (quants == (0x80 if kind == "q8_0" else 0)).all()


@pytest.mark.parametrize("kind", BLOCK_KINDS)
@pytest.mark.parametrize(("n", "k"), [(5, 96), (17, 32), (61, 2048)])
def test_pack_round_trip(native: ops.Kernels, kind: str, n: int, k: int) -> None:
    """from_blocks (the C repack) then unpack_blocks gives ggml's bytes back, for any input shape."""
    blocks = _blocks(kind, n, k, seed=1)
    qw = QuantizedWeight.from_blocks(kind, blocks.flatten(), n, k)
    assert torch.equal(qw.data, native.pack_blocks(kind, blocks, n, k))
    assert torch.equal(unpack_blocks(qw), blocks)


def test_pack_blocks_dispatches_to_c(native: ops.Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """pack_blocks runs the kernel when the library is there, the reference when it is not (same bytes)."""
    blocks, calls = _blocks("q8_0", 17, 64), []
    real = ops.Kernels.pack_blocks

    def spy(self: ops.Kernels, *args: object) -> torch.Tensor:
        calls.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(ops.Kernels, "pack_blocks", spy)
    got = pack_blocks("q8_0", blocks, 17, 64)
    assert calls == ["q8_0"]
    monkeypatch.setattr(ops, "kernels", lambda: None)
    assert torch.equal(pack_blocks("q8_0", blocks, 17, 64), got)
    assert calls == ["q8_0"]


def test_pack_non_contiguous_input(native: ops.Kernels) -> None:
    blocks = _blocks("q4_1", 2 * 17, 64)[::2]  # every other row: a strided view
    assert not blocks.is_contiguous()
    want = pack_blocks_reference("q4_1", blocks, 17, 64)
    assert torch.equal(native.pack_blocks("q4_1", blocks, 17, 64), want)


@pytest.mark.parametrize("pack", ["c", "reference", "dispatch"])
def test_pack_bad_sizes(native: ops.Kernels, pack: str) -> None:
    fn = {"c": native.pack_blocks, "reference": pack_blocks_reference, "dispatch": pack_blocks}[pack]
    good = _blocks("q4_0", 4, 64)
    with pytest.raises(ValueError, match="expected 144 uint8 bytes, found 143"):
        fn("q4_0", good.flatten()[:-1], 4, 64)
    with pytest.raises(ValueError, match="uint8"):
        fn("q4_0", good.view(torch.int8), 4, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        fn("q4_0", good, 4 * 64 // 48, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        fn("q4_0", good[:0], 4, 0)
    with pytest.raises(ValueError, match="kind"):
        fn("q4_k", good, 4, 64)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
@pytest.mark.parametrize(("n", "k"), [(1, 32), (17, 96), (61, 2048)])
def test_pack_rows_matches_reference(lib: ops.Kernels, kind: str, n: int, k: int) -> None:
    """pack_rows (each row found by address, here in a shuffled order with repeats) = pack_blocks_reference
    of the rows gathered in that order."""
    blocks = _blocks(kind, n + 3, k, seed=2)
    g = torch.Generator().manual_seed(n)
    order = torch.cat([torch.randperm(n + 3, generator=g)[: n - 1], torch.zeros(1, dtype=torch.int64)])
    rows = blocks.data_ptr() + order * blocks.stride(0)
    want = pack_blocks_reference(kind, blocks[order], n, k)
    assert torch.equal(lib.pack_rows(kind, rows, n, k), want)


def test_pack_rows_bad_inputs(native: ops.Kernels) -> None:
    blocks = _blocks("q8_0", 4, 64)
    rows = blocks.data_ptr() + torch.arange(4) * blocks.stride(0)
    with pytest.raises(ValueError, match=r"int64 CPU row addresses \[5\] expected"):
        native.pack_rows("q8_0", rows, 5, 64)
    with pytest.raises(ValueError, match="int64 CPU row addresses"):
        native.pack_rows("q8_0", rows.int(), 4, 64)
    with pytest.raises(ValueError, match="positive multiple of 32"):
        native.pack_rows("q8_0", rows, 4, 48)
    with pytest.raises(ValueError, match="kind 'q4_k'"):
        native.pack_rows("q4_k", rows, 4, 64)


def test_gather_rows(lib: ops.Kernels) -> None:
    """gather_rows (rows of any bytes found by address: F16 / BF16 and K-quant weights used as stored) = the
    rows indexed in that order, repeats included; bad arguments are refused."""
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (40, 210), dtype=torch.uint8, generator=g)
    order = torch.tensor([5, 39, 0, 5, 17])
    rows = data.data_ptr() + order * data.stride(0)
    assert torch.equal(lib.gather_rows(rows, 210), data[order])
    with pytest.raises(ValueError, match="int64 CPU row addresses"):
        lib.gather_rows(rows.int(), 210)
    with pytest.raises(ValueError, match="row_bytes > 0"):
        lib.gather_rows(rows, 0)


def test_pack_and_gather_large_outputs_mapped_up_front(native: ops.Kernels) -> None:
    """Outputs of a few MB, where each of two threads first maps its share of the fresh output in one call
    (common.c's `blz_populate`): the same bytes as the reference pack and as indexing."""
    n, k = 4096, 1024
    blocks = _blocks("q4_0", n, k, seed=5)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(2))
    rows = blocks.data_ptr() + order * blocks.stride(0)
    with intra_op_threads(2):
        want = pack_blocks_reference("q4_0", blocks, n, k)
        assert torch.equal(native.pack_blocks("q4_0", blocks, n, k), want)
        assert torch.equal(native.gather_rows(rows, blocks.shape[1]), blocks[order])
