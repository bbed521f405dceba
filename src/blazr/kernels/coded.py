"""Float weights with their top byte coded in 4 bits (kinds bf16z and f32z): every bit of a bf16 weight in 3/4
of the bytes, of an f32 weight in 7/8 — the layout, its torch references, and when the loader takes it.

A float decode step is a read of the weights, at the memory's rate in blazr and in llama.cpp alike
(benchmarks/NOTES.md §53, §55), so the one way to a faster step is fewer bytes. A weight's top byte is its
sign and 7 of its 8 exponent bits, and a weight row uses few exponents: the 15 most frequent top bytes of a
random N(0, σ²) row cover all but ~1e-4 of it (14 binades). So the top byte is stored as a 4-bit code into a
16-entry table of the row, the rare others whole in a short list (the escapes: K/128 slots a row, 0.8 %), and
every other bit as it is (bf16: one byte; f32: three). A trained checkpoint's rate is not measured here (none
in float is on the build machine); a weight with a row past its slots stays stored. Lossless:
csrc/linear_coded.c, whose header gives the layout, decodes the bits as stored and gives the stored kind's
kernel's bits on the same weight — linear_16bit.c's for bf16z, linear_float.c's for f32z — at every row count,
on every build: the coding changes speed and size only.

Bytes: data uint8 [N, row_bytes(K)], K a multiple of 64 below 65536. `pack_reference` / `unpack` code and
decode in torch; `pack` in C (csrc/linear_coded.c `blz_pack_coded`, the same bytes). A weight with more than
cap − 1 escapes in some row is not codable and stays as it is (`pack` returns None).

An f16 or f32 weight whose every value bf16 holds — an F16 or F32 GGUF converted from a bf16 checkpoint, as
most published ones are, or a float32 checkpoint saved from bf16 weights: each value's low mantissa bits
clear — is coded as bf16z (`as_bf16`). csrc/linear_16bit.c gives the same bits on f16 and bf16 weights of the
same values, so an F16 file's results are its own to the bit, in 3/4 of the bytes. An f32 weight so coded is
read in 3/8 of its bytes; its results are the f32 kernel's to fp32 rounding (the same exact products, summed
in linear_16bit.c's order rather than linear_float.c's). An f16 weight that bf16 does not hold (an F16 GGUF
of float32 weights) stays f16; such an f32 one is coded as f32z.

The loader codes bf16 (and such f16) linears and MoE expert stacks (`--quantize bf16`, a GGUF's BF16 / F16
tensors) and float32 linears and expert stacks (a float32 checkpoint or F32 GGUF under `auto`; `none` keeps
them as loaded) where the library has its vector decode (AVX2 or AVX-512; the scalar build would decode the
whole weight per call), the rows are long enough to gain (`worth`) and host tuning measured the coded decode
faster (`wanted`, per coded kind; `choices` lists a weight's); `BLAZR_CODED=0` / `1` decides instead.
"""

from __future__ import annotations

import itertools

import torch

from blazr.kernels import ops, tuning
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import QuantizedWeight

KIND_OF = {"bf16": "bf16z", "f32": "f32z"}  # stored kind → coded kind
BASE_OF = {coded: kind for kind, coded in KIND_OF.items()}
CODED_AS = {"f16": "bf16", "f32": "bf16"}  # coded as that kind where it holds every value (`as_bf16`)
_BITS = {torch.float16: torch.int16, torch.float32: torch.int32}  # a float dtype's bits, to compare
_CHECK_ELEMENTS = 1 << 20  # `as_bf16` converts this many values at a time (its temporaries stay small)
BLOCK = 64  # weights per block: 64 bytes under the top ones, 32 of codes (f32z: then 128 of the low 16 bits)
_TABLES = 32  # bytes of a row's table: the top byte of each of the 16 codes, then 16 zero bytes


def cap(k: int) -> int:
    """Escape slots of a row of k weights (at most cap − 1 used; csrc's blz_bz_cap)."""
    return -(-max(8, k // 128) // 8) * 8


def block_bytes(kind: str) -> int:
    return 224 if kind == "f32z" else 96


def row_bytes(k: int, kind: str = "bf16z") -> int:
    """Bytes of one coded row of k weights."""
    return _TABLES + 4 * cap(k) + k // BLOCK * block_bytes(kind)


def codable_shape(k: int) -> bool:
    """Whether rows of k weights fit the layout: k a multiple of 64 below 65536 (escapes' columns: uint16)."""
    return k > 0 and k % BLOCK == 0 and k < 65536


def worth(k: int, kind: str = "bf16z") -> bool:
    """Whether the loader codes rows of k weights: a shape the layout holds, the coded row at most 0.85×
    (bf16z) or 0.91× (f32z) of the stored bytes (a short row's tables and escape slots outweigh what its
    codes save: bf16z 1.25× at 64, 0.81× at 512, 0.77× from 2048; f32z 0.91× at 512, 0.88× from 2048)."""
    stored, share = (4, 0.91) if kind == "f32z" else (2, 0.85)
    return codable_shape(k) and row_bytes(k, kind) <= share * stored * k


def positions(kind: str = "bf16z") -> torch.Tensor:
    """int64 [64]: the byte position of column j of a block (csrc's blz_bz_pos): where the AVX-512 decode
    leaves it in lane j % 16 of register j / 16 (f32z's decode interleaves words, not bytes, last)."""
    j = torch.arange(BLOCK)
    i, lane = j // 16, j % 16
    if kind == "f32z":
        return 16 * (lane // 4) + 4 * i + lane % 4
    return 16 * (lane // 4) + 8 * (i // 2) + 2 * (lane % 4) + i % 2


def _low_slots() -> torch.Tensor:
    """int64 [64]: f32z: the uint16 slot after the codes of column j's low 16 bits (csrc's blz_bz_low_at: in
    position order, chunk 0 the positions 16L + t, chunk 1 16L + 8 + t, t < 8)."""
    p = positions("f32z")
    return 32 * ((p % 16) // 8) + 8 * (p // 16) + p % 8


def _check(w: torch.Tensor) -> None:
    if w.dim() != 2 or w.dtype not in (torch.bfloat16, torch.float32) or not codable_shape(w.shape[1]):
        raise ValueError(f"coded: a bf16 or f32 weight [N, K] with K a multiple of {BLOCK} below 65536 "
                         f"expected, found {w.dtype} {list(w.shape)}")  # fmt: skip


def _top_bits(w: torch.Tensor) -> torch.Tensor:
    """int64 [N, K]: each weight's top 16 bits (a bf16 weight's all)."""
    if w.dtype == torch.float32:
        return (w.contiguous().view(torch.int32).to(torch.int64) >> 16) & 0xFFFF
    return w.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF


def pack_reference(w: torch.Tensor) -> torch.Tensor | None:
    """bf16 or f32 [N, K] → uint8 [N, row_bytes(K)] in torch (the C pack's bytes), or None when some row has
    more than cap − 1 escapes."""
    _check(w)
    n, k = w.shape
    kind = KIND_OF["f32" if w.dtype == torch.float32 else "bf16"]
    bits = _top_bits(w)
    top = bits >> 8
    hist = torch.zeros(n, 256, dtype=torch.int64).scatter_add_(1, top, torch.ones_like(top))
    hist[:, 0] = 0
    # the 15 most frequent non-zero top bytes, the lower first on ties (a stable sort of −count)
    order = torch.sort(-hist, dim=1, stable=True).indices[:, :15]
    table = torch.zeros(n, 16, dtype=torch.int64)
    table[:, 1:] = torch.where(hist.gather(1, order) > 0, order, 0)
    code_of = torch.full((n, 256), -1, dtype=torch.int64)
    code_of.scatter_(1, table[:, 1:].flip(1), torch.arange(15, 0, -1).expand(n, 15).contiguous())
    code_of[:, 0] = 0  # top byte 0: code 0 (set last: unused table slots hold 0 too)
    code = code_of.gather(1, top)
    escaped = code < 0
    c = cap(k)
    if n and int(escaped.sum(1).max()) > c - 1:
        return None
    code = code.clamp(min=0)
    nb, pos, bb = k // BLOCK, positions(kind), block_bytes(kind)
    blocks = torch.zeros(n, nb, bb, dtype=torch.uint8)
    blocks[..., pos] = (bits & 0xFF).view(n, nb, BLOCK).to(torch.uint8)
    nib = torch.zeros(n, nb, BLOCK, dtype=torch.int64)
    nib[..., pos] = code.view(n, nb, BLOCK)
    blocks[..., 64:96] = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)
    if kind == "f32z":
        low = torch.zeros(n, nb, BLOCK, dtype=torch.int64)
        low[..., _low_slots()] = (w.contiguous().view(torch.int32).to(torch.int64) & 0xFFFF).view(
            n, nb, BLOCK
        )
        blocks[..., 96:] = low.to(torch.int32).to(torch.int16).view(torch.uint8).view(n, nb, 128)
    esc = torch.full((n, c, 2), 0xFFFF, dtype=torch.int64)
    rows, cols = escaped.nonzero(as_tuple=True)  # row-major: each row's columns ascending
    slot = escaped.to(torch.int64).cumsum(1)[rows, cols] - 1
    esc[rows, slot, 0], esc[rows, slot, 1] = cols, bits[rows, cols]
    head = torch.cat([table, torch.zeros_like(table)], dim=1).to(torch.uint8)  # [N, 32]
    esc_bytes = esc.to(torch.int32).to(torch.int16).view(torch.uint8).reshape(n, 4 * c)  # uint16 pairs
    return torch.cat([head, esc_bytes, blocks.reshape(n, nb * bb)], dim=1).contiguous()


def unpack(kind: str, data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """A coded weight's bytes uint8 [N, row_bytes(K)] → its bf16 (bf16z) or f32 (f32z) [N, K], in torch."""
    c, nb, bb = cap(k), k // BLOCK, block_bytes(kind)
    if data.dtype != torch.uint8 or tuple(data.shape) != (n, row_bytes(k, kind)):
        raise ValueError(f"{kind} data: expected uint8 [{n}, {row_bytes(k, kind)}], found {data.dtype} "
                         f"{list(data.shape)}")  # fmt: skip
    d = data.to(torch.int64)
    blocks = d[:, _TABLES + 4 * c :].reshape(n, nb, bb)
    pos = positions(kind)
    under = blocks[..., pos].reshape(n, k)
    codes = (blocks[..., 64 + pos // 2] >> (4 * (pos % 2)) & 15).reshape(n, k)
    top = d[:, :16].gather(1, codes) << 8 | under
    esc = (
        data[:, _TABLES : _TABLES + 4 * c].contiguous().view(torch.int16).to(torch.int64).view(n, c, 2)
        & 0xFFFF
    )
    rows, slots = (esc[..., 0] != 0xFFFF).nonzero(as_tuple=True)
    top[rows, esc[rows, slots, 0]] = esc[rows, slots, 1]
    if kind == "bf16z":
        return top.to(torch.int32).to(torch.int16).view(torch.bfloat16)
    low16 = data[:, _TABLES + 4 * c :].reshape(n, nb, bb)[..., 96:].contiguous().view(torch.int16)
    low = (low16.to(torch.int64) & 0xFFFF)[..., _low_slots()].reshape(n, k)
    return (top << 16 | low).to(torch.int32).view(torch.float32)


def choices(qw: QuantizedWeight) -> list[str]:
    """The coded kinds weight `qw` may become here, best first, each where `wanted`: bf16z for a bf16 weight,
    and for an f16 or f32 one whose row 0 bf16 holds (`as_bf16` checks the others when it is made); then f32z
    for an f32 one. Empty: the weight stays as it is."""
    k, kinds, base = qw.in_features, [], CODED_AS.get(qw.kind)
    if base is not None and wanted(base, k) and _row0_held(qw):
        kinds.append(KIND_OF[base])
    if qw.kind in KIND_OF and wanted(qw.kind, k):
        kinds.append(KIND_OF[qw.kind])
    return kinds


def _row0_held(qw: QuantizedWeight) -> bool:
    """Whether bf16 holds every value of row 0 of `qw` (an f16 / f32 weight)."""
    return qw.out_features > 0 and _in_bf16(_stored_rows(qw, 0, 1)) is not None


def _in_bf16(w: torch.Tensor) -> torch.Tensor | None:
    """w (f16 / f32) as bf16 when bf16 holds each of its values bit for bit (the stored bits back from
    the bf16 ones), else None."""
    bf = w.to(torch.bfloat16)
    return bf if torch.equal(bf.to(w.dtype).view(_BITS[w.dtype]), w.view(_BITS[w.dtype])) else None


def _stored_rows(qw: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
    """[stop − start, K] of the stored dtype: rows start..stop (a MappedWeight gathers those rows alone)."""
    return qw.gather(start, stop) if isinstance(qw, MappedWeight) else qw.data[start:stop]


def as_bf16(qw: QuantizedWeight) -> QuantizedWeight | None:
    """An f16 or f32 weight [N, K] as a bf16 one when bf16 holds each of its values bit for bit (the stored
    bits back from the bf16 ones), else None. Row 0 is tried alone first, so a weight whose values bf16 does
    not hold costs one row at each load; then the others, `_CHECK_ELEMENTS` values at a time (a MappedWeight's
    rows are read where they lie, never gathered)."""
    if qw.kind not in CODED_AS or qw.out_features == 0:
        return None
    n, k = qw.out_features, qw.in_features
    out = torch.empty(n, k, dtype=torch.bfloat16)
    bounds = [0, *range(1, n, max(1, _CHECK_ELEMENTS // k)), n]
    for start, stop in itertools.pairwise(bounds):
        bf = _in_bf16(_stored_rows(qw, start, stop))
        if bf is None:
            return None
        out[start:stop] = bf
    return QuantizedWeight("bf16", out, n, k)


def pack(qw: QuantizedWeight, kinds: list[str] | None = None) -> QuantizedWeight | None:
    """A bf16 or f32 weight coded (the C pack when the library is loaded, else `pack_reference`) — an f16 or
    f32 one as bf16z where `as_bf16` holds it —, in the first of `kinds` (default: any) it can take; None when
    it is not codable (its kind or shape, a row of too many rare top bytes, f16 values bf16 does not hold)."""
    if (qw.kind not in CODED_AS and qw.kind not in KIND_OF) or not codable_shape(qw.in_features):
        return None
    kinds = list(KIND_OF.values()) if kinds is None else kinds
    if qw.kind in CODED_AS and KIND_OF[CODED_AS[qw.kind]] in kinds and (held := as_bf16(qw)) is not None:
        qw = held
    if KIND_OF.get(qw.kind) not in kinds:
        return None
    w, lib = qw.data, ops.kernels()
    data = lib.pack_coded(w) if lib is not None and w.is_cpu else pack_reference(w)
    return None if data is None else QuantizedWeight(KIND_OF[qw.kind], data, qw.out_features, qw.in_features)


def decodes(lib: ops.Kernels | None) -> bool:
    """Whether the library decodes coded rows in vectors as it reads them (AVX2 and AVX-512 builds; the scalar
    build decodes a whole weight a call: tests only)."""
    return lib is not None and "avx2" in lib.features


def wanted(kind: str, k: int) -> bool:
    """Whether the loader codes a weight of `kind` (bf16, f32) as `KIND_OF[kind]` with rows of k here: rows
    worth coding, where the library has its vector decode (`decodes`); then `BLAZR_CODED` (0 / 1) when set,
    else host tuning's choice (kernels/tuning.py `coded_bf16` / `coded_f32`: coded unless the stored kind's
    decode read faster here)."""
    lib = ops.kernels()
    if kind not in KIND_OF or not decodes(lib) or not worth(k, KIND_OF[kind]):
        return False
    return tuning.takes("BLAZR_CODED", f"coded_{kind}", "coded", default="coded")
