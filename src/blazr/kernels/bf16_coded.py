"""bf16 weights with their exponents coded in 4 bits (kind bf16z): every bit of a bf16 weight, in 3/4 of the
bytes — the layout, its torch references, and when the loader takes it.

A 16-bit decode step is a read of the weights, at the memory's rate in blazr and in llama.cpp alike
(benchmarks/NOTES.md §53, §55), so the one way to a faster 16-bit step is fewer bytes. A trained (or random)
weight row uses few of bf16's 256 exponents: its 15 most frequent cover all but ~1e-4 of the row. So each
weight is stored as its sign and 7 mantissa bits (a byte) beside a 4-bit code of its exponent in a 16-entry
table of the row, the rare others whole in a short list (the escapes). Lossless: csrc/linear_bf16z.c, whose
header gives the layout, decodes the bf16 bits as stored and gives linear_16bit.c's bits for the same weight
at every row count, on every build — the coding changes speed and size only (0.77× the bytes at K = 2048).

Bytes: data uint8 [N, row_bytes(K)], K a multiple of 64 below 65536. `pack_reference` / `unpack` code and
decode in torch; `pack` in C (csrc/linear_bf16z.c `blz_pack_bf16z`, the same bytes). A weight with more than
cap − 1 escapes in some row is not codable and stays bf16 (`pack` returns None).

The loader codes bf16 linears (`--quantize bf16`, a GGUF's BF16 tensors) where the library has its AVX-512
decode (elsewhere the kernel would decode the whole weight per call), unless `BLAZR_BF16Z=0`.
"""

from __future__ import annotations

import os

import torch

from blazr.kernels import ops
from blazr.kernels.quant import QuantizedWeight

KIND = "bf16z"
BLOCK = 64  # weights per block: 64 bytes of sign | mantissa, 32 bytes of exponent codes
_TABLES = 32  # bytes of a row's exponent tables: hi (e >> 1) then lo ((e & 1) << 7), 16 codes each


def cap(k: int) -> int:
    """Escape slots of a row of k weights (at most cap − 1 used; csrc's blz_bz_cap)."""
    return -(-max(8, k // 128) // 8) * 8


def row_bytes(k: int) -> int:
    """Bytes of one coded row of k weights."""
    return _TABLES + 4 * cap(k) + k // BLOCK * 96


def codable_shape(k: int) -> bool:
    """Whether rows of k weights fit the layout: k a multiple of 64 below 65536 (escapes' columns: uint16)."""
    return k > 0 and k % BLOCK == 0 and k < 65536


def worth(k: int) -> bool:
    """Whether the loader codes rows of k weights: a shape the layout holds, the coded row at most 0.85× its
    bf16 bytes (a short row's tables and escape slots outweigh what its codes save: 1.25× at 64, 0.81× at
    512, 0.77× from 2048)."""
    return codable_shape(k) and row_bytes(k) <= 0.85 * 2 * k


def positions() -> torch.Tensor:
    """int64 [64]: the byte position of column j of a block (csrc's blz_bz_pos)."""
    j = torch.arange(BLOCK)
    i, lane = j // 16, j % 16
    return 16 * (lane // 4) + 8 * (i // 2) + 2 * (lane % 4) + i % 2


def _check(w: torch.Tensor) -> None:
    if w.dim() != 2 or w.dtype != torch.bfloat16 or not codable_shape(w.shape[1]):
        raise ValueError(f"bf16z: a bf16 weight [N, K] with K a multiple of {BLOCK} below 65536 expected, "
                         f"found {w.dtype} {list(w.shape)}")  # fmt: skip


def pack_reference(w: torch.Tensor) -> torch.Tensor | None:
    """bf16 [N, K] → uint8 [N, row_bytes(K)] in torch (the C pack's bytes), or None when some row has more
    than cap − 1 escapes."""
    _check(w)
    n, k = w.shape
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [N, K]
    exp = (bits >> 7) & 0xFF
    hist = torch.zeros(n, 256, dtype=torch.int64).scatter_add_(
        1, exp, torch.ones_like(exp, dtype=torch.int64)
    )
    hist[:, 0] = 0
    # the 15 most frequent non-zero exponents, the lower first on ties (a stable sort of −count)
    order = torch.sort(-hist, dim=1, stable=True).indices[:, :15]
    counts = hist.gather(1, order)
    table = torch.zeros(n, 16, dtype=torch.int64)
    table[:, 1:] = torch.where(counts > 0, order, 0)
    code_of = torch.full((n, 256), -1, dtype=torch.int64)
    code_of.scatter_(1, table[:, 1:].flip(1), torch.arange(15, 0, -1).expand(n, 15).contiguous())
    code_of[:, 0] = 0  # exponent 0: code 0 (set last: unused table slots hold exponent 0 too)
    code = code_of.gather(1, exp)
    raw = ((bits >> 8) & 0x80) | (bits & 0x7F)
    escaped = code < 0
    c = cap(k)
    if n and int(escaped.sum(1).max()) > c - 1:
        return None
    code, raw = code.clamp(min=0), torch.where(escaped, 0, raw)
    nb, pos = k // BLOCK, positions()
    blocks = torch.zeros(n, nb, 96, dtype=torch.uint8)
    raw_b, code_b = raw.view(n, nb, BLOCK), code.view(n, nb, BLOCK)
    blocks[..., pos] = raw_b.to(torch.uint8)
    nib = torch.zeros(n, nb, BLOCK, dtype=torch.int64)
    nib[..., pos] = code_b
    blocks[..., 64:] = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)
    esc = torch.full((n, c, 2), 0xFFFF, dtype=torch.int32)
    rows, cols = escaped.nonzero(as_tuple=True)  # row-major: each row's columns ascending
    if rows.numel():
        slot = escaped.to(torch.int64).cumsum(1)[rows, cols] - 1
        esc[rows, slot, 0] = cols.to(torch.int32)
        esc[rows, slot, 1] = bits[rows, cols]
    head = torch.cat([(table >> 1), (table & 1) << 7], dim=1).to(torch.uint8)  # [N, 32]
    esc_bytes = esc.to(torch.int16).view(torch.uint8).reshape(n, 4 * c)  # uint16 little-endian pairs
    return torch.cat([head, esc_bytes, blocks.reshape(n, nb * 96)], dim=1).contiguous()


def unpack(data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """A bf16z weight's bytes uint8 [N, row_bytes(K)] → its bf16 [N, K], in torch."""
    c, nb = cap(k), k // BLOCK
    if data.dtype != torch.uint8 or tuple(data.shape) != (n, row_bytes(k)):
        raise ValueError(
            f"bf16z data: expected uint8 [{n}, {row_bytes(k)}], found {data.dtype} {list(data.shape)}"
        )
    d = data.to(torch.int32)
    hi, lo = d[:, :16], d[:, 16:32]
    blocks = d[:, _TABLES + 4 * c :].reshape(n, nb, 96)
    pos = positions()
    raw = blocks[..., pos]  # [N, nb, 64] by column
    codes = blocks[..., 64 + pos // 2] >> (4 * (pos % 2)) & 15
    flat_codes = codes.reshape(n, k)
    flat_raw = raw.reshape(n, k)
    bits = ((flat_raw & 0x80) | hi.gather(1, flat_codes)) << 8 | (flat_raw & 0x7F) | lo.gather(1, flat_codes)
    esc = (
        data[:, _TABLES : _TABLES + 4 * c].contiguous().view(torch.int16).to(torch.int32).reshape(n, c, 2)
        & 0xFFFF
    )
    used = esc[..., 0] != 0xFFFF
    rows, slots = used.nonzero(as_tuple=True)
    bits[rows, esc[rows, slots, 0].long()] = esc[rows, slots, 1]
    return bits.to(torch.int16).view(torch.bfloat16)


def pack(qw: QuantizedWeight) -> QuantizedWeight | None:
    """A bf16 weight coded (the C pack when the library is loaded, else `pack_reference`), or None when it is
    not codable (its shape, or a row of too many rare exponents)."""
    if qw.kind != "bf16" or not codable_shape(qw.in_features):
        return None
    w = qw.data
    lib = ops.kernels()
    data = lib.pack_bf16z(w) if lib is not None and w.is_cpu else pack_reference(w)
    return None if data is None else QuantizedWeight(KIND, data, qw.out_features, qw.in_features)


def wanted() -> bool:
    """Whether the loader codes bf16 linears here: where the library has its AVX-512 decode, unless
    `BLAZR_BF16Z=0`."""
    lib = ops.kernels()
    return lib is not None and "avx512" in lib.features and os.environ.get("BLAZR_BF16Z") != "0"
