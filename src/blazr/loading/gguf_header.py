"""The GGUF header: magic, version, key/value metadata and tensor infos, parsed straight from the bytes.

Owns: turning the header of a little-endian GGUF (v2 or v3) into plain Python — `metadata` with the values
`gguf.GGUFReader`'s `field.contents()` gives (int / float / bool / str, lists of them for arrays; nested
arrays flattened as the reader flattens them) and one `TensorHeader` per tensor (name, ggml type id, `ne`
dims fastest-first, absolute data offset). No tensor data is read.

Why not gguf-py's reader: it builds one numpy view per array element (a 49k-token vocabulary and its 49k
merges are ~250k views), 1.2–2.5 s to open SmolLM2; here strings are one `struct.unpack_from` and one
slice each, and numeric arrays one `np.frombuffer`. tests/test_gguf.py checks both readers agree on
fixture files with every value type and on the embedded SmolLM2 file.

Errors: a short, corrupt or foreign header raises ValueError naming what was wrong (the caller words it
for the user); a big-endian file raises `ByteOrderError`.

In: a buffer holding the file (an `mmap`, bytes). Out: `GGUFHeader`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# GGUF value type ids (gguf.GGUFValueType)
_UINT32, _STRING, _ARRAY = 4, 8, 9
_SCALARS: dict[int, str] = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<?",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_NUMPY: dict[int, np.dtype[Any]] = {k: np.dtype("?" if f == "<?" else f) for k, f in _SCALARS.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")

# ggml tensor types: id → (name, values per block, bytes per block) — gguf.constants' GGMLQuantizationType and
# GGML_QUANT_SIZES, kept here so that opening a GGUF does not import the gguf package (~0.15 s with its yaml
# and metadata modules); tests/test_gguf.py checks the two tables agree.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip
GGML_SIZES: dict[str, tuple[int, int]] = {name: (q, s) for name, q, s in GGML_TYPES.values()}


class ByteOrderError(ValueError):
    """The file is a GGUF written for the other byte order."""


@dataclass(frozen=True)
class TensorHeader:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value (GGML_TYPES)
    dims: tuple[int, ...]  # GGUF `ne`: fastest-varying first
    offset: int  # absolute byte offset of the tensor's data in the file


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorHeader]
    alignment: int
    data_offset: int  # where tensor data starts (tensor offsets are relative to it in the file)


class _Cursor:
    """Sequential little-endian reads from `buf`, each checked against its end."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.size, self.at = buf, len(buf), 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.at + n > self.size:
            raise ValueError(f"{what} needs {n} bytes at offset {self.at}, past the end ({self.size} bytes)")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.at)
        self.at += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.at)
        self.at += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        s = self.buf[self.at : self.at + n]
        self.at += n
        return str(s, "utf-8")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` GGUF strings in a row (the hot loop of a tokenizer's vocabulary and merges)."""
        buf, at, size, unpack = self.buf, self.at, self.size, _U64.unpack_from
        out = []
        append = out.append
        for _ in range(count):
            if at + 8 > size:
                self.at = at
                self.need(8, what)
            (n,) = unpack(buf, at)
            at += 8
            if at + n > size:
                self.at = at
                self.need(n, what)
            append(str(buf[at : at + n], "utf-8"))
            at += n
        self.at = at
        return out

    def value(self, vtype: int, what: str) -> Any:
        if vtype == _STRING:
            return self.string(what)
        fmt = _SCALARS.get(vtype)
        if fmt is not None:
            n = struct.calcsize(fmt)
            self.need(n, what)
            (v,) = struct.unpack_from(fmt, self.buf, self.at)
            self.at += n
            return v
        if vtype == _ARRAY:
            return self.array(what)
        raise ValueError(f"{what}: unknown value type {vtype}")

    def array(self, what: str) -> list[Any]:
        itype = self.u32(what)
        count = self.u64(what)
        if itype == _STRING:
            return self.strings(count, what)
        dtype = _NUMPY.get(itype)
        if dtype is not None:
            self.need(count * dtype.itemsize, what)
            values = np.frombuffer(self.buf, dtype, count, self.at).tolist()
            self.at += count * dtype.itemsize
            return values
        if itype == _ARRAY:  # nested: flattened, as GGUFReader's contents() flattens them
            return [v for _ in range(count) for v in self.array(what)]
        raise ValueError(f"{what}: unknown array element type {itype}")


def parse_header(buf: Any) -> GGUFHeader:
    """Parse the GGUF header at the start of `buf` (the whole file); every tensor's type must be a known
    ggml type and its data must lie inside the buffer."""
    c = _Cursor(buf)
    c.need(4, "magic")
    if bytes(buf[0:4]) != _MAGIC:
        raise ValueError(f"magic {bytes(buf[0:4])!r}, expected {_MAGIC!r}")
    c.at = 4
    version = c.u32("version")
    if version & 0xFFFF == 0:
        raise ByteOrderError("GGUF written for the other byte order (big-endian)")
    if version not in _VERSIONS:
        raise ValueError(f"GGUF version {version}, expected one of {_VERSIONS}")
    num_tensors, num_kv = c.u64("tensor count"), c.u64("metadata count")

    metadata: dict[str, Any] = {}
    alignment_type = None
    for _ in range(num_kv):
        key = c.string("metadata key")
        vtype = c.u32(f"metadata {key!r}")
        if key in metadata:
            raise ValueError(f"duplicate metadata key {key!r}")
        metadata[key] = c.value(vtype, f"metadata {key!r}")
        if key == "general.alignment":
            alignment_type = vtype

    infos = []
    names: set[str] = set()
    for _ in range(num_tensors):
        name = c.string("tensor name")
        if name in names:
            raise ValueError(f"duplicate tensor {name!r}")
        names.add(name)
        num_dims = c.u32(f"tensor {name!r}")
        dims = tuple(c.u64(f"tensor {name!r}") for _ in range(num_dims))
        ggml_type = c.u32(f"tensor {name!r}")
        infos.append((name, dims, ggml_type, c.u64(f"tensor {name!r}")))

    alignment = _DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        if alignment_type != _UINT32:
            raise ValueError("general.alignment is not a uint32")
        if alignment == 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
    data_offset = -(-c.at // alignment) * alignment
    tensors = []
    for name, dims, t, off in infos:
        if t not in GGML_TYPES:
            raise ValueError(f"tensor {name!r} has unknown ggml type {t}")
        _, block_size, type_size = GGML_TYPES[t]
        end = data_offset + off + math.prod(dims) // block_size * type_size
        if end > c.size:
            raise ValueError(f"tensor {name!r} data ends at byte {end}, past the end ({c.size} bytes)")
        tensors.append(TensorHeader(name, t, dims, data_offset + off))
    return GGUFHeader(version, metadata, tensors, alignment, data_offset)
