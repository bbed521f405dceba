"""GGUF files: open, validate, list, and dequantize tensors (vectorized torch; the common kinds in C).

Owns: opening a `.gguf` file (memory-mapped; its header parsed by loading/gguf_header.py), the checks that
turn a missing, foreign, truncated or inconsistent file into one-line `CheckpointError`s, zero-copy access to
each tensor's quantized bytes (`GGUFFile.raw`), block dequantization for the ggml types in
`SUPPORTED_TYPES`, and undoing llama.cpp's q/k row permutation (the HF names of GGUF tensors:
loading/gguf_hf.py).

Memory: a tensor that is copied (dequantized by `load`, or repacked by the caller from `raw`) should not
stay in this process's resident set as mapped file pages too. `load` reads with `pread` (the map is not
touched); a caller that copied out of `raw` calls `release(name)`, which drops the tensor's whole pages
from the map (`madvise(MADV_DONTNEED)`: clean copy-on-write pages, re-read from the file if touched again).

In: a path. Out: `metadata` (plain Python values), tensor names/types/shapes, and float tensors in torch
order (`[out, in]` for matrices: GGUF lists dims fastest-first, so its `ne` is reversed here).

Shape letters:
  N  number of quantization blocks in a tensor
  S  type size: bytes per block (34 for Q8_0, 144 for Q4_K, ...)
  Q  block size: values per block (1 for F32/F16/BF16, 32 for Q4_0..Q8_0, 256 for the K-quants)
  G  sub-blocks per K-quant super-block (8 of 32 values for Q4_K/Q5_K, 16 of 16 for Q2_K/Q3_K/Q6_K)
  R, C  rows and row length of a tensor in torch order (C = ne0, the contiguous dim)
  H, D  heads and head dim (q/k un-permutation)
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blazr.errors import CheckpointError, UnsupportedError
from blazr.kernels.formats import BY_KIND
from blazr.kernels.quant import GGML_KINDS
from blazr.loading import mxfp4
from blazr.loading.gguf_header import GGML_SIZES, GGML_TYPES, ByteOrderError, parse_header

_MAGIC = b"GGUF"
_QK_K = 256  # values per K-quant super-block


# --------------------------------------------------------------------------------------------------------
# Dequantization kernels. Each maps blocks [N, S] uint8 → values [N, Q] float32 and repeats the reference's
# float32 operation order exactly (gguf.quants), so results are bit-identical: products and sums are
# separate ops (no fused multiply-add), scales are fp16 widened to fp32 before use.
# --------------------------------------------------------------------------------------------------------


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of every block, as float32 [N, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[N, K] bytes → [N, 2K]: all low nibbles, then all high nibbles (ggml's Q4 element order)."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """[N, K] bytes → [N, 8K] bits, little-endian: element i is bit i % 8 of byte i // 8."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][qs: 16 B, 32 × 4-bit] → d * (q - 8)
    q = _nibbles(blocks[:, 2:18]).to(torch.float32).sub_(8)
    return q.mul_(_f16(blocks, 0))


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][m: f16][qs: 16 B] → d * q + m
    q = _nibbles(blocks[:, 4:20]).to(torch.float32)
    return q.mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][qh: 4 B, bit i = 5th bit of value i][qs: 16 B] → d * (q - 16)
    q = _nibbles(blocks[:, 6:22]) | (_bits(blocks[:, 2:6]) << 4)
    return q.to(torch.float32).sub_(16).mul_(_f16(blocks, 0))


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][m: f16][qh: 4 B][qs: 16 B] → d * q + m
    q = _nibbles(blocks[:, 8:24]) | (_bits(blocks[:, 4:8]) << 4)
    return q.to(torch.float32).mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][qs: 32 × int8] → d * q
    return blocks[:, 2:34].view(torch.int8).to(torch.float32).mul_(_f16(blocks, 0))


def _q8_k(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f32][qs: 256 × int8][bsums: 16 × int16, unused here] → d * q
    d = blocks[:, 0:4].contiguous().view(torch.float32)
    return blocks[:, 4 : 4 + _QK_K].view(torch.int8).to(torch.float32).mul_(d)


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    # [scales: 16 B, low nibble = scale, high = min][qs: 64 B, 2-bit][d: f16][dmin: f16]
    N = blocks.shape[0]
    scales = blocks[:, 0:16]
    dl = (_f16(blocks, 80) * (scales & 0x0F).to(torch.float32)).view(N, 16, 1)
    ml = (_f16(blocks, 82) * (scales >> 4).to(torch.float32)).view(N, 16, 1)
    # qs [N, 2 halves, 1, 32] >> [0, 2, 4, 6] → [N, 2, 4, 32] → 16 groups of 16 values
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    q = ((blocks[:, 16:80].reshape(N, 2, 1, 32) >> shifts) & 3).reshape(N, 16, 16).to(torch.float32)
    return (dl * q).sub_(ml).view(N, _QK_K)


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    # [hmask: 32 B][qs: 64 B, 2-bit][scales: 12 B, 16 × 6-bit][d: f16]
    N = blocks.shape[0]
    dev = blocks.device
    scales = blocks[:, 96:108]
    low = _nibbles(scales[:, 0:8])  # [N, 16] low 4 bits of each scale
    shifts2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=dev)
    high = ((scales[:, 8:12].unsqueeze(1) >> shifts2.view(1, 4, 1)) & 3).reshape(N, 16)  # top 2 bits
    sc = ((low | (high << 4)).view(torch.int8) - 32).to(torch.float32)
    dl = (_f16(blocks, 108) * sc).view(N, 16, 1)
    ql = ((blocks[:, 32:96].reshape(N, 2, 1, 32) >> shifts2.view(1, 1, 4, 1)) & 3).reshape(N, 16, 16)
    # hmask bit set means "no -4 offset": q = ql - 4 * (1 - bit)
    shifts8 = torch.arange(8, dtype=torch.uint8, device=dev).view(1, 1, 8, 1)
    qh = ((blocks[:, 0:32].reshape(N, 1, 1, 32) >> shifts8) & 1).reshape(N, 16, 16) ^ 1
    q = (ql.view(torch.int8) - (qh << 2).view(torch.int8)).to(torch.float32)
    return (dl * q).view(N, _QK_K)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 12-byte field → 8 six-bit scales and 8 six-bit mins, each [N, 8] float32.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for the
    mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
    """
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][dmin: f16][scales: 12 B][qs: 128 B] → per 32-value group g: d*sc[g] * q - dmin*m[g]
    N = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = (_f16(blocks, 0) * sc).view(N, 8, 1)
    dm = (_f16(blocks, 2) * mn).view(N, 8, 1)
    # qs [N, 4 chunks, 32] → per chunk 32 low nibbles then 32 high nibbles → [N, 8, 32]
    qs = blocks[:, 16:144].reshape(N, 4, 32)
    q = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(N, 8, 32).to(torch.float32)
    return q.mul_(d).sub_(dm).view(N, _QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # [d: f16][dmin: f16][scales: 12 B][qh: 32 B, bit g of byte j = 5th bit of value 32g + j][qs: 128 B]
    N = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = (_f16(blocks, 0) * sc).view(N, 8, 1)
    dm = (_f16(blocks, 2) * mn).view(N, 8, 1)
    qs = blocks[:, 48:176].reshape(N, 4, 32)
    ql = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(N, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=blocks.device).view(1, 8, 1)
    qh = (blocks[:, 16:48].reshape(N, 1, 32) >> shifts) & 1  # [N, 8, 32]
    q = (ql | (qh << 4)).to(torch.float32)
    return q.mul_(d).sub_(dm).view(N, _QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # [ql: 128 B, low 4 bits][qh: 64 B, high 2 bits][scales: 16 × int8][d: f16] → d*sc[g] * (q - 32)
    N = blocks.shape[0]
    sc = blocks[:, 192:208].view(torch.int8).to(torch.float32)
    d = (_f16(blocks, 208) * sc).view(N, 16, 1)
    ql = blocks[:, 0:128].reshape(N, 2, 1, 64) >> torch.tensor(
        [0, 4], dtype=torch.uint8, device=blocks.device
    ).view(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(N, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    qh = ((blocks[:, 128:192].reshape(N, 2, 1, 32) >> shifts) & 3).reshape(N, 8, 32)
    q = ((ql | (qh << 4)).view(torch.int8) - 32).view(N, 16, 16).to(torch.float32)
    return q.mul_(d).view(N, _QK_K)


def _f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float32).clone()


def _f16_values(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).to(torch.float32)


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    # bf16 is the top half of an f32: shift the bits up (exact, NaN payloads included)
    return (blocks.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


_KERNELS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F32": _f32,
    "F16": _f16_values,
    "BF16": _bf16,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q8_K": _q8_k,
    "MXFP4": mxfp4.dequantize_gguf,
}
SUPPORTED_TYPES: tuple[str, ...] = tuple(_KERNELS)
# types csrc/dequantize.c takes: the block-quantized types of the format table (kernels/formats.py)
_C_KINDS = {t: kind for t, kind in GGML_KINDS.items() if BY_KIND[kind].block > 1}

# Blocks per kernel call: bounds the temporaries (a few × chunk × Q × 4 bytes) and keeps them in cache.
_CHUNK_VALUES = 1 << 20


def _type_sizes(ggml_type: str) -> tuple[int, int]:
    """(block size Q, type size S) of a ggml type name."""
    return GGML_SIZES[ggml_type]


def _num_bytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    block_size, type_size = _type_sizes(ggml_type)
    return math.prod(shape) // block_size * type_size


def dequantize(raw: torch.Tensor, ggml_type: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 values [*shape] of ggml-encoded bytes `raw` (any shape; contiguous bytes in file order).

    `shape` is in torch order, so its last dim is the row length that blocks tile. Always returns a new
    tensor that owns its memory, even for F32. Q4_0 / Q4_1 / Q8_0 and Q4_K / Q5_K / Q6_K on the CPU go
    through the C kernel (csrc/dequantize.c) when the kernel library is loaded; `dequantize_reference` is
    the torch code (the same bits).
    """
    kind, shape = _C_KINDS.get(ggml_type), tuple(int(s) for s in shape)
    if kind is not None and raw.is_cpu and len(shape) > 0:
        from blazr.kernels import ops  # here: loading a GGUF's header needs no kernel library

        lib = ops.kernels()
        if lib is not None:
            _check_size(raw, ggml_type, shape)
            rows = math.prod(shape[:-1])
            return lib.dequantize_blocks(kind, raw.reshape(-1).view(torch.uint8), rows, shape[-1]).view(shape)
    return dequantize_reference(raw, ggml_type, shape)


def _check_size(raw: torch.Tensor, ggml_type: str, shape: tuple[int, ...]) -> None:
    """CheckpointError unless `raw` holds exactly the bytes of a `ggml_type` tensor of `shape`."""
    block_size, _ = _type_sizes(ggml_type)
    if shape and shape[-1] % block_size != 0:
        raise CheckpointError(
            f"{ggml_type} tensor of shape {shape}: row length {shape[-1]} is not a multiple of "
            f"the block size {block_size}"
        )
    num_bytes = _num_bytes(ggml_type, shape)
    if raw.numel() * raw.element_size() != num_bytes:
        raise CheckpointError(
            f"{ggml_type} tensor of shape {shape}: expected {num_bytes} bytes, found "
            f"{raw.numel() * raw.element_size()}"
        )


def dequantize_reference(raw: torch.Tensor, ggml_type: str, shape: tuple[int, ...]) -> torch.Tensor:
    """`dequantize` in torch, for every type in `SUPPORTED_TYPES`."""
    kernel = _KERNELS.get(ggml_type)
    if kernel is None:
        raise UnsupportedError(
            f"ggml type {ggml_type} cannot be dequantized; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    block_size, type_size = _type_sizes(ggml_type)
    shape = tuple(int(s) for s in shape)
    _check_size(raw, ggml_type, shape)
    blocks = raw.reshape(-1).view(torch.uint8).view(-1, type_size)  # [N, S]
    num_blocks = blocks.shape[0]
    chunk = max(1, _CHUNK_VALUES // block_size)
    if num_blocks <= chunk:
        return kernel(blocks).view(shape)
    out = torch.empty(num_blocks, block_size, dtype=torch.float32, device=blocks.device)  # [N, Q]
    for start in range(0, num_blocks, chunk):
        out[start : start + chunk] = kernel(blocks[start : start + chunk])
    return out.view(shape)


# --------------------------------------------------------------------------------------------------------
# The q/k permutation (llama.cpp stores rotary pairs interleaved).
# --------------------------------------------------------------------------------------------------------


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time permutation of q/k rows (weights [H*D, C] or biases [H*D]).

    llama.cpp stores each head's rows as interleaved rotary pairs; HF keeps the two halves apart. Pass the
    query head count for q and the key/value head count for k (as transformers' `reverse_permute` does).
    """
    rows = w.shape[0]
    if num_heads <= 0 or rows % (2 * num_heads) != 0:
        raise CheckpointError(
            f"cannot un-permute q/k rows: expected a multiple of 2 × {num_heads} heads, found {rows} rows"
        )
    # [H, D/2, 2, ...] → swap the pair and half axes → [H, 2, D/2, ...]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------------------------------------
# The file.
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TensorInfo:
    ggml_type: str
    shape: tuple[int, ...]  # torch order
    offset: int  # absolute byte offset in the file
    num_bytes: int


class GGUFFile:
    """One memory-mapped GGUF file: metadata, tensor listing, raw bytes, and dequantized tensors.

    Opening parses the header and checks that every tensor's bytes lie inside the file and do not run into
    the next tensor; no tensor data is read until `raw`/`load`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.paths = (self.path,)  # the files behind it (several for a split GGUF: loading/gguf_split.py)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: GGUF file not found")
        file_size = self.path.stat().st_size
        with self.path.open("rb") as f:
            magic = f.read(4)
        if magic != _MAGIC:
            raise CheckpointError(
                f"{self.path}: not a GGUF file (expected magic {_MAGIC!r}, found {magic!r})"
            )
        # copy-on-write mapping: writable, so torch can wrap it without copying; writes never reach disk
        with self.path.open("rb") as f:  # not empty: it has the magic
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            header = parse_header(self._mmap)
        except ByteOrderError:
            raise UnsupportedError(
                f"{self.path}: GGUF byte order differs from this machine's; blazr reads only "
                "little-endian GGUF"
            ) from None
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.path}: a metadata key or string is not valid UTF-8 ({e})") from e
        except ValueError as e:
            raise CheckpointError(
                f"{self.path}: unreadable GGUF, truncated or corrupt ({file_size} bytes): {e}"
            ) from e
        self.metadata: dict[str, Any] = header.metadata
        self._tensors: dict[str, _TensorInfo] = {}
        for t in header.tensors:
            ggml_type = GGML_TYPES[t.ggml_type][0]
            shape = tuple(reversed(t.dims))
            self._tensors[t.name] = _TensorInfo(ggml_type, shape, t.offset, _num_bytes(ggml_type, shape))
        self._check_ranges(file_size)
        self.tensor_names: list[str] = list(self._tensors)
        self._buf = torch.from_numpy(np.frombuffer(self._mmap, np.uint8))  # the whole file, zero-copy

    def _check_ranges(self, file_size: int) -> None:
        """Every tensor's bytes inside the file, and none running into the next one."""
        by_offset = sorted(self._tensors.items(), key=lambda kv: kv[1].offset)
        for i, (name, info) in enumerate(by_offset):
            end = info.offset + info.num_bytes
            what = f"tensor {name!r} ({info.ggml_type}, shape {info.shape})"
            if end > file_size:
                raise CheckpointError(
                    f"{self.path}: {what} needs bytes [{info.offset}, {end}) but the file has {file_size} "
                    "bytes (truncated?)"
                )
            if i + 1 < len(by_offset):
                next_name, next_info = by_offset[i + 1]
                if end > next_info.offset:
                    raise CheckpointError(
                        f"{self.path}: {what} needs {info.num_bytes} bytes at offset {info.offset}, but "
                        f"tensor {next_name!r} starts {next_info.offset - info.offset} bytes later; its byte "
                        "size does not match its shape and type"
                    )

    def _info(self, name: str) -> _TensorInfo:
        info = self._tensors.get(name)
        if info is None:
            some = ", ".join(self.tensor_names[:3])
            raise CheckpointError(
                f"{self.path}: no tensor named {name!r} (file has {len(self._tensors)} tensors: {some}, ...)"
            )
        return info

    def tensor_type(self, name: str) -> str:
        """The ggml type name of tensor `name` ("F32", "Q4_K", ...)."""
        return self._info(name).ggml_type

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name` in torch order (GGUF `ne` reversed: `[out, in]` for matrices)."""
        return self._info(name).shape

    def raw(self, name: str) -> torch.Tensor:
        """Zero-copy uint8 view [R, bytes per row] of the stored bytes (copy-on-write: never write to it)."""
        info = self._info(name)
        num_rows = math.prod(info.shape[:-1])
        data = self._buf[info.offset : info.offset + info.num_bytes]
        return data.view(num_rows, info.num_bytes // max(num_rows, 1))

    def prefetch(self) -> None:
        """Ask the kernel to read the tensor data into the page cache ahead (MADV_WILLNEED, asynchronous;
        nothing joins this process's resident set). Loading touches the map a row at a time in fused /
        un-permuted order, which defeats the fault-time readahead: from a cold page cache the embedded
        model's tensors took 0.94 s to pack without it, 0.17 s with it (llama.cpp prefetches too)."""
        if self._tensors and hasattr(mmap, "MADV_WILLNEED"):
            start = min(t.offset for t in self._tensors.values()) // mmap.PAGESIZE * mmap.PAGESIZE
            self._mmap.madvise(mmap.MADV_WILLNEED, start, len(self._mmap) - start)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether tensor `t` views this file's map (its bytes were not copied out)."""
        start = self._buf.data_ptr()
        return start <= t.data_ptr() < start + self._buf.numel()

    def span(self, address: int, num_bytes: int) -> torch.Tensor:
        """Zero-copy uint8 view of `num_bytes` bytes of the map from `address` (one of `raw`'s addresses)."""
        at = address - self._buf.data_ptr()
        if at < 0 or at + num_bytes > self._buf.numel():
            raise ValueError(f"span of {num_bytes} bytes at {address:#x}: outside {self.path}'s map")
        return self._buf[at : at + num_bytes]

    def read(self, name: str) -> torch.Tensor:
        """A new uint8 tensor [R, bytes per row] holding the stored bytes, read with `pread` (the memory map
        is not touched, so the file's pages do not join this process's resident set)."""
        info = self._info(name)
        num_rows = math.prod(info.shape[:-1])
        out = torch.empty(num_rows, info.num_bytes // max(num_rows, 1), dtype=torch.uint8)
        view = memoryview(out.numpy()).cast("B")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            done = 0
            while done < info.num_bytes:
                n = os.preadv(fd, [view[done:]], info.offset + done)
                if n <= 0:
                    raise CheckpointError(f"{self.path}: file ended while reading tensor {name!r}")
                done += n
        finally:
            os.close(fd)
        return out

    def release(self, name: str) -> None:
        """Drop the whole pages of tensor `name` from this process's map of the file. Only for a tensor that
        nothing views any more (its bytes were copied): the pages are clean copies of the file, so a later
        `raw` reads them back from the file (page cache), but a write made through a view would be lost."""
        info = self._info(name)
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page
        end = (info.offset + info.num_bytes) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def load(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Tensor `name` dequantized to `dtype`, in torch order; a new tensor, never a view of the file."""
        info = self._info(name)
        if info.ggml_type not in _KERNELS:
            raise UnsupportedError(
                f"{self.path}: tensor {name!r} has ggml type {info.ggml_type}, which blazr cannot "
                f"dequantize; supported: {', '.join(SUPPORTED_TYPES)}"
            )
        native = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(info.ggml_type)
        if native == dtype:  # stored as asked: one read, no float32 round trip
            return self.read(name).view(native).reshape(info.shape)
        return dequantize(self.read(name), info.ggml_type, info.shape).to(dtype)

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {len(self._tensors)} tensors)"
