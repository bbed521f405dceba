"""Safetensors checkpoints: one file (any name) or HF shards with an index json, read tensor by tensor.

`SafetensorsCheckpoint` parses every header up front (a truncated or corrupt file fails here with one line
naming the file) and maps every tensor name to its file, dtype, shape and byte range. Tensors are then read
one at a time, never the whole checkpoint at once:
- `load(name)` returns a fresh tensor in the stored dtype, read with `pread` into memory the caller owns
  (the file's pages stay in the page cache, not in this process's resident set);
- `load(name, dtype)` converts while it reads (one conversion, the temporary freed with the call), or,
  when the stored dtype already is `dtype`, hands out a view of a private copy-on-write memory map of the
  file (`alias=True`): no copy at all. The map lives as long as any tensor that views it (each such tensor
  holds a reference to it), so weights survive the checkpoint object; a write to a view changes this
  process's copy of that page only, never the file.
- `row_addresses(name)` gives where each row of a tensor lies in that map, for the C quantizer to read in
  place (`--quantize int8|int4`: no float copy); `release(name)` then drops the tensor's mapped pages;
  `span(address, n)` views n bytes of a map (`--quantize bf16` on a bf16 checkpoint: gate|up stored back
  to back used where they lie).
- MXFP4 pairs (`X_blocks` [E, N, G, 16] + `X_scales` [E, N, G], uint8: GPT-OSS's experts) are one float32
  tensor `X` [E, 32·G, N], dequantized on `load` as transformers does (loading/mxfp4.py); `load_mxfp4`
  gives the stored pair to a loader that keeps it as stored (loading/stored.py).

Format: 8 bytes little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets: [begin,
end)}, "__metadata__": {...}}, then the data; offsets are relative to the end of the header.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from blazr.errors import CheckpointError
from blazr.loading import mxfp4

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER = 100 << 20  # the reference implementation's limit


def shard_files(index_path: Path) -> list[Path]:
    """The shard files named by a `*.safetensors.index.json`, each checked to exist."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path}: not a valid safetensors index ({e})") from None
    files = []
    for name in sorted(set(weight_map.values())):
        path = index_path.parent / name
        if not path.is_file():
            raise CheckpointError(
                f"{index_path}: shard {name} is listed but missing from {index_path.parent}"
            )
        files.append(path)
    return files


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    num_bytes: int


def _read_header(path: Path) -> dict[str, _Entry]:
    """Every tensor of one file, each byte range checked against the file size and its dtype × shape."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: corrupt or truncated safetensors file ({why})")

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise bad(f"header length {n} does not fit in {size} bytes")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    start = 8 + n
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"tensor {name!r}: bad entry {info!r} ({type(e).__name__}: {e})") from None
        want = math.prod(shape) * dtype.itemsize
        if end - begin != want or begin < 0:
            raise bad(
                f"tensor {name!r}: {info['dtype']} {list(shape)} needs {want} bytes, found [{begin}, {end})"
            )
        if start + end > size:
            raise bad(f"tensor {name!r} ends at byte {start + end} of a {size}-byte file")
        entries[name] = _Entry(path, dtype, shape, start + begin, want)
    return entries


class SafetensorsCheckpoint:
    """Tensor names → shapes/dtypes and one-at-a-time reads across one or more safetensors files."""

    def __init__(self, files: list[Path], prefix: str = "") -> None:
        """`prefix`: put before every stored name (a transformers base-model save's `layers.N.…` read as
        `model.layers.N.…`, detect.base_model_prefix)."""
        self.files = files
        self._entries: dict[str, _Entry] = {}
        for path in files:
            for stored, entry in _read_header(Path(path)).items():
                name = prefix + stored
                if name in self._entries:
                    raise CheckpointError(f"{path}: tensor {name} also appears in {self._entries[name].path}")
                self._entries[name] = entry
        self._maps: dict[Path, mmap.mmap] = {}
        self._mxfp4 = mxfp4.paired(self._entries)  # float name → (blocks, scales)
        self._names = set(self._entries).difference(*self._mxfp4.values()) | set(self._mxfp4)

    @property
    def names(self) -> set[str]:
        return set(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._mxfp4:
            return mxfp4.hf_shape(self._entries[self._mxfp4[name][0]].shape)
        return self._entries[name].shape

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32 if name in self._mxfp4 else self._entries[name].dtype

    def file_of(self, name: str) -> Path:
        return self._entries[self._mxfp4[name][0] if name in self._mxfp4 else name].path

    def load(self, name: str, dtype: torch.dtype | None = None, alias: bool = False) -> torch.Tensor:
        """Tensor `name` in `dtype` (default: as stored). A new tensor, unless `alias` and the stored dtype is
        `dtype` already: then a view of the copy-on-write map of the file (see the module docstring)."""
        if name in self._mxfp4:
            blocks, scales = (self.load(n) for n in self._mxfp4[name])
            return mxfp4.dequantize_hf_transposed(blocks, scales).to(dtype or torch.float32)
        e = self._entries[name]
        want = dtype or e.dtype
        if alias and want == e.dtype and e.offset % e.dtype.itemsize == 0 and e.num_bytes:
            return self._map(e.path)[e.offset : e.offset + e.num_bytes].view(e.dtype).view(e.shape)
        out = torch.empty(e.shape, dtype=e.dtype)
        if e.num_bytes:
            _pread_into(e.path, e.offset, out.view(-1).view(torch.uint8))
        return out if want == e.dtype else out.to(want)

    def load_mxfp4(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The stored pair behind MXFP4 tensor `name` — (blocks [E, N, G, 16], scales [E, N, G], uint8) — for
        a loader that keeps it as stored (loading/stored.py `mxfp4_as_stored`); None for any other tensor."""
        if name not in self._mxfp4:
            return None
        blocks, scales = (self.load(n) for n in self._mxfp4[name])
        return blocks, scales

    def row_addresses(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(stored dtype name, e.g. "BF16"; int64 [rows]: the address of each row of tensor `name` [*, C] in
        the file's copy-on-write map) for a reader that takes rows in place (the C quantizer); None for an
        empty, scalar or misaligned tensor (or an MXFP4 pair's float tensor). The map lives as long as this
        object (`close` drops it)."""
        if name in self._mxfp4:
            return None
        e = self._entries[name]
        if not e.shape or not e.num_bytes or e.offset % e.dtype.itemsize:
            return None
        num_rows, row_bytes = math.prod(e.shape[:-1]), e.shape[-1] * e.dtype.itemsize
        base = self._map(e.path).data_ptr() + e.offset
        return _NAMES[e.dtype], base + torch.arange(num_rows, dtype=torch.int64) * row_bytes

    def span(self, address: int, num_bytes: int) -> torch.Tensor:
        """Zero-copy uint8 view of `num_bytes` bytes of a file's map from `address` (one of `row_addresses`'s
        addresses): a weight whose parts lie back to back in the file, used as one tensor."""
        for path in self._maps:
            buf = self._map(path)
            at = address - buf.data_ptr()
            if at >= 0 and at + num_bytes <= buf.numel():
                return buf[at : at + num_bytes]
        raise ValueError(f"span of {num_bytes} bytes at {address:#x}: outside the maps of {self.files}")

    def release(self, name: str) -> None:
        """Drop the whole pages of tensor `name` from this process's map of its file: for a tensor whose
        values were copied out (quantized) and that no tensor views; they are clean copies of the page cache,
        read back if touched again."""
        if name in self._mxfp4:
            return
        e = self._entries[name]
        m = self._maps.get(e.path)
        page = mmap.PAGESIZE
        start, end = -(-e.offset // page) * page, (e.offset + e.num_bytes) // page * page
        if m is not None and end > start and hasattr(mmap, "MADV_DONTNEED"):
            m.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _map(self, path: Path) -> torch.Tensor:
        """The whole file as a uint8 tensor over a private (copy-on-write) memory map."""
        if path not in self._maps:
            with path.open("rb") as f:
                self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return torch.frombuffer(self._maps[path], dtype=torch.uint8)

    def close(self) -> None:
        """Drop this object's references to the file maps; tensors that view a map keep it alive."""
        self._maps.clear()


def _pread_into(path: Path, offset: int, out: torch.Tensor) -> None:
    """Fill the contiguous uint8 tensor `out` with the file's bytes at `offset`."""
    view = memoryview(out.numpy()).cast("B")
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise CheckpointError(f"{path}: file ended at byte {offset + done} while reading a tensor")
            done += n
    finally:
        os.close(fd)
