"""Weight formats of the kernel library: `QuantizedWeight`, the torch references `quantize` /
`dequantize`, and the row-packed layout of the block kinds (`pack_blocks` / `unpack_blocks`).

Block kinds hold ggml's values, 32 weights per block (row_bytes = K/32 · block_bytes):
- q4_0 (18 B): f16 d, 16 B nibbles — w = d·(q − 8)
- q4_1 (20 B): f16 d, f16 m, 16 B nibbles — w = d·q + m
- q8_0 (34 B): f16 d, 32 int8 — w = d·q
In ggml's byte order nibble byte j holds element j (low half) and element j + 16 (high half). A
QuantizedWeight stores them row-packed for the kernel (csrc/linear_q.c): rows in groups of 16 (the last
group padded with zero rows), a group as K/32 tiles, tile b = block b of the 16 rows:
[16 f16 d][16 f16 m, q4_1][quants: byte 4j + i of 64-byte chunk c = element 4c + i of row j] — for the
4-bit kinds chunk p's bytes are ggml's nibble bytes 4p..4p+3 of each row (elements 4p+i low, 16+4p+i high),
for q8_0 the int8 values + 128. The same bytes as ggml's, moved: `unpack_blocks` gives ggml's back
exactly. `pack_blocks` moves them in C (csrc/pack.c, OpenMP over row groups) when the kernel library is
loaded, else in torch: `pack_blocks_reference`, the same bytes (tests/test_pack.py). Float kinds keep a
torch tensor: bf16, f16 or f32 [N, K] (a GGUF's F16 / BF16 tensor as stored: a view of the file's map).

K-quant kinds (GGUF Q4_K / Q5_K / Q6_K, 256 weights per super-block; csrc/linear_k.c) keep ggml's bytes
exactly as a GGUF file stores them, uint8 [N, row_bytes] with row_bytes = K/256 · block_bytes — no repack,
so a view of an mmap'd file can be used in place and `ggml_blocks` is `data` itself:
- q4_k (144 B): f16 d, f16 dmin, 12 B of 6-bit scales / mins, 128 B nibbles — w = d·sc·q − dmin·m per 32
- q5_k (176 B): as q4_k plus 32 B of 5th bits — q in 0..31
- q6_k (210 B): 128 B low nibbles, 64 B high 2 bits, 16 int8 scales, f16 d — w = d·sc·(q − 32) per 16
On a kernel build with AVX-512 VNNI the loader re-lays K-quant linears in 16-row groups (kinds q4_kx /
q5_kx / q6_kx: kernels/kquant_packed.py says why and when), the same bytes moved, the stored kinds' bits.

q8_0g (34 B per 32 weights: f16 d, 32 int8 — w = d·q) is GGUF Q8_0 kept the same way, ggml's bytes as
stored, uint8 [N, K/32 · 34] (csrc/linear_q8.c): the values of q8_0 and the same arithmetic (activation
rounding, exact integer block dots, the same fp32 fmas in order), so the same bits as q8_0's packed kernel
on the same weights — without the repack at load or a second copy beside the mapped file. A GGUF's Q8_0
tensors load as q8_0g (`from_ggml`); `quantize(w, "q8_0")` (`--quantize int8`) keeps the packed layout,
which its C quantizer writes directly.

mxfp4 (17 B per 32 weights: e8m0 e, 16 B of e2m1 nibbles — w = 2^(e − 128)·kv, kv the doubled e2m1 value) is
GGUF MXFP4 kept the same way, ggml's bytes as stored, uint8 [N, K/32 · 17] (csrc/linear_b32.c; its values
and HF's packing in kernels/mxfp4.py): GPT-OSS's experts at 4.25 bits a weight. Its kernel rounds
activations as the 32-block kinds (`int8_dot_reference` emulates it); `quantize(w, "mxfp4")` is gguf-py's
quantizer (in torch).

q5_0 (22 B per 32 weights: f16 d, 4 B of fifth bits, 16 B nibbles — w = d·((q | h << 4) − 16)) is GGUF Q5_0
kept the same way, uint8 [N, K/32 · 22] (csrc/linear_b32.c, beside mxfp4; its values in kernels/q5_0.py):
what llama.cpp's K-quant files hold for rows of no multiple of 256 values (Gemma 3, Qwen2.5-0.5B). Its kernel
rounds activations as the 32-block kinds (`int8_dot_reference` emulates it).

`quantize` reproduces gguf's numpy quantizers (`gguf.quants`, bit-exact with ggml's reference C quantizers)
byte for byte for the 32-block kinds — in C (csrc/quantize.c, straight into the packed layout) when the kernel
library is loaded, else `quantize_reference` in torch (kernels/quant_reference.py); the same bytes
(tests/test_quantize_kernel.py) (ggml's K-quant quantizers search scales iteratively; the tests take K-quant
weights from llama.cpp's own quantizer, or kernels/kquant.py's `random_kquant`); `dequantize` reproduces
`gguf.quants.dequantize` for every kind. The K-quant kernels' activation rounding (`quantize_q8_k`) is in
kernels/kquant.py, row tables (a GGUF's token table kept as stored) in kernels/row_table.py.

Shapes: N = out_features, K = in_features, nb = K/32 blocks per row, G = ⌈N/16⌉ row groups; K-quants:
K/256 super-blocks per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blazr.kernels import kquant_fields, mxfp4, q5_0
from blazr.kernels.formats import BY_KIND, FORMATS, kinds, stored_kind, value_kind
from blazr.kernels.kquant_fields import KQUANT_BYTES, QK_K

# The lists below are views of the one format table (kernels/formats.py).
QK = 32  # weights per block
BLOCK_BYTES = {k: BY_KIND[k].block_bytes for k in kinds("packed")}
BLOCK_KINDS = tuple(BLOCK_BYTES)
K_KINDS = tuple(KQUANT_BYTES)
KX_KINDS = kinds("kpacked")  # q4_kx, q5_kx, q6_kx: K-quants in 16-row groups (kernels/kquant_packed.py)
Q8_0G = "q8_0g"  # Q8_0 in ggml's own layout, run as stored (csrc/linear_q8.c)
MXFP4 = "mxfp4"  # GGUF MXFP4 in ggml's own layout, run as stored (csrc/linear_b32.c)
Q5_0 = "q5_0"  # GGUF Q5_0 in ggml's own layout, run as stored (csrc/linear_b32.c)
# bf16z, f32z: bf16 / f32 with their top byte coded, lossless (kernels/coded.py)
CODED_KINDS = kinds("coded")
# 32-weight block kinds kept in ggml's own row layout, [N, K/32 · block_bytes] (no repack)
GGML_BLOCK_KINDS = (Q8_0G, MXFP4, Q5_0)
# A fused weight whose parts (row segments) are of different kinds run as stored, of one K — llama.cpp's
# Q4_K_M keeps attn_v in Q6_K where attn_q / attn_k are Q4_K, Gemma 3's attn_v in Q8_0 where they are Q5_0.
# Its bytes: a 64-byte table (int32 count ≤ 7, int32 kind codes [7], int32 rows [7]), then each part's ggml
# bytes in order (csrc/linear_mix.c: all K-quants as stored run by linear_k.c in one pass, else segment by
# segment — K-quant segments re-laid in 16-row groups included, kernels/kquant_packed.py).
KMIX = "kmix"
_KMIX_CODES = {k: BY_KIND[k].c_kind for k in (*K_KINDS, *GGML_BLOCK_KINDS, *KX_KINDS)}  # BLZ_Q4_K …, Q4_KX …
MIX_KINDS = tuple(_KMIX_CODES)  # the kinds a kmix weight's segments may be
_KMIX_HEADER, _KMIX_MAX = 64, 7
FLOAT_KINDS: dict[str, torch.dtype] = {f.kind: f.dtype for f in FORMATS if f.dtype is not None}
KINDS = tuple(f.kind for f in FORMATS)
# GGML tensor type names (gguf.GGMLQuantizationType.name) that map onto a kind: the kind of their values.
GGML_KINDS: dict[str, str] = {f.ggml: value_kind(f.ggml) for f in FORMATS if f.ggml}  # type: ignore[misc]
# The kind a GGUF tensor of a value kind runs as when its bytes are kept as stored (`from_ggml`), where that
# is not the value kind itself.
AS_STORED = {kind: stored for t, kind in GGML_KINDS.items() if (stored := stored_kind(t)) not in (None, kind)}


ROW_GROUP = 16  # rows per packed group


def row_bytes(kind: str, dim: int) -> int:
    """Bytes of one [dim] row of `kind` in ggml's layout (ValueError when dim does not split into blocks)."""
    if kind in FLOAT_KINDS:
        return dim * FLOAT_KINDS[kind].itemsize
    if kind in CODED_KINDS:
        from blazr.kernels import coded  # here: it imports this module

        if not coded.codable_shape(dim):
            raise ValueError(f"{kind} rows of {dim} values: not a multiple of 64 below 65536")
        return coded.row_bytes(dim, kind)
    if kind in GGML_BLOCK_KINDS:
        qk, bs = QK, BY_KIND[kind].block_bytes
    else:
        kquant = kind in KQUANT_BYTES or kind in KX_KINDS  # a re-laid K-quant's rows: its stored kind's bytes
        qk, bs = (QK_K, BY_KIND[kind].block_bytes) if kquant else (QK, BLOCK_BYTES[kind])
    if dim % qk:
        raise ValueError(f"{kind} rows of {dim} values: not a multiple of {qk}")
    return dim // qk * bs


def _group_bytes(kind: str, in_features: int) -> int:
    return ROW_GROUP * in_features // QK * BLOCK_BYTES[kind]


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A linear layer's weight [N, K] in one of `KINDS`.

    `data` is uint8 [G, 16 · row_bytes] for block kinds (row-packed, see the module docstring; build one
    from ggml-ordered blocks with `from_blocks`), uint8 [N, row_bytes] in ggml's own layout for q8_0g,
    mxfp4 and the K-quant kinds, else a bf16 / f32 tensor [N, K]. It must be contiguous; the C kernels read
    it in place."""

    kind: str
    data: torch.Tensor
    out_features: int
    in_features: int

    def __post_init__(self) -> None:
        n, k, d = self.out_features, self.in_features, self.data
        if self.kind in BLOCK_BYTES:
            if k % QK:
                raise ValueError(f"{self.kind} weight: in_features {k} is not a multiple of {QK}")
            want, dtype = (-(-n // ROW_GROUP), _group_bytes(self.kind, k)), torch.uint8
        elif self.kind in GGML_BLOCK_KINDS:
            if k % QK:
                raise ValueError(f"{self.kind} weight: in_features {k} is not a multiple of {QK}")
            want, dtype = (n, row_bytes(self.kind, k)), torch.uint8
        elif self.kind == KMIX:  # row_bytes: ValueError when k does not split into a segment kind's blocks
            segs = _kmix_segments(d)
            if sum(rows for _, rows in segs) != n:
                found = [r for _, r in segs]
                raise ValueError(f"kmix weight: its parts have {found} rows, expected {n} in all")
            want, dtype = (_KMIX_HEADER + sum(rows * row_bytes(kd, k) for kd, rows in segs),), torch.uint8
        elif self.kind in KQUANT_BYTES:
            if k % QK_K:
                raise ValueError(f"{self.kind} weight: in_features {k} is not a multiple of {QK_K}")
            want, dtype = (n, row_bytes(self.kind, k)), torch.uint8
        elif self.kind in KX_KINDS:
            if k % QK_K or n % ROW_GROUP:
                raise ValueError(f"{self.kind} weight [{n}, {k}]: in_features must be a multiple of {QK_K}, "
                                 f"out_features of {ROW_GROUP}")  # fmt: skip
            size = ROW_GROUP * k // QK_K * BY_KIND[self.kind].block_bytes
            want, dtype = (n // ROW_GROUP, size), torch.uint8
        elif self.kind in CODED_KINDS:
            want, dtype = (n, row_bytes(self.kind, k)), torch.uint8
        elif self.kind in FLOAT_KINDS:
            want, dtype = (n, k), FLOAT_KINDS[self.kind]
        else:
            raise ValueError(f"weight kind {self.kind!r}: expected one of {KINDS}")
        if tuple(d.shape) != want or d.dtype != dtype:
            raise ValueError(
                f"{self.kind} weight data: expected {dtype} {list(want)}, found {d.dtype} {list(d.shape)}"
            )
        if not d.is_contiguous():
            raise ValueError(f"{self.kind} weight data must be contiguous")

    @property
    def is_block(self) -> bool:
        """A kind of 32-weight blocks (q4_0, q4_1, q8_0 packed; q8_0g and mxfp4 as stored)."""
        return self.kind in BLOCK_BYTES or self.kind in GGML_BLOCK_KINDS

    @property
    def is_kquant(self) -> bool:
        """A K-quant kind (as stored or in 16-row groups), or a kmix weight all of whose segments are
        K-quants."""
        if self.kind == KMIX:
            return all(kd in KQUANT_BYTES or kd in KX_KINDS for kd, _ in _kmix_segments(self.data))
        return self.kind in KQUANT_BYTES or self.kind in KX_KINDS

    def parts(self) -> list[QuantizedWeight]:
        """A kmix weight's row segments (views of `data`), each of one kind; [self] otherwise."""
        if self.kind != KMIX:
            return [self]
        out, at, k = [], _KMIX_HEADER, self.in_features
        for kind, rows in _kmix_segments(self.data):
            size, lines = rows * row_bytes(kind, k), rows // ROW_GROUP if kind in KX_KINDS else rows
            out.append(QuantizedWeight(kind, self.data[at : at + size].view(lines, -1), rows, k))
            at += size
        return out

    @classmethod
    def from_parts(cls, parts: list[QuantizedWeight]) -> QuantizedWeight:
        """The row concatenation of weights of kinds run as stored (K-quants — or re-laid in 16-row groups —,
        q8_0g, mxfp4, q5_0) with one in_features (fused q|k|v, gate|up): one kind when they share it, else a
        kmix weight (the segment table, then their bytes)."""
        kinds, k = [p.kind for p in parts], parts[0].in_features
        if any(kd not in _KMIX_CODES for kd in kinds) or any(p.in_features != k for p in parts):
            raise ValueError(
                f"from_parts: parts of {tuple(_KMIX_CODES)} of one in_features expected, found {kinds}"
            )
        n = sum(p.out_features for p in parts)
        if len(set(kinds)) == 1:
            return cls(kinds[0], torch.cat([p.data for p in parts]), n, k)
        segs = [(kd, p.out_features) for kd, p in zip(kinds, parts, strict=True)]
        merged = [segs[0]]
        for kd, rows in segs[1:]:  # neighbours of one kind share a segment
            merged[-1:] = [(kd, merged[-1][1] + rows)] if merged[-1][0] == kd else [merged[-1], (kd, rows)]
        if len(merged) > _KMIX_MAX:
            raise ValueError(f"from_parts: {len(merged)} segments of different kinds, at most {_KMIX_MAX}")
        table = torch.zeros(1 + 2 * _KMIX_MAX, dtype=torch.int32)
        table[0] = len(merged)
        for i, (kd, rows) in enumerate(merged):
            table[1 + i], table[1 + _KMIX_MAX + i] = _KMIX_CODES[kd], rows
        header = torch.zeros(_KMIX_HEADER, dtype=torch.uint8)
        header[: table.numel() * 4] = table.view(torch.uint8)
        return cls(KMIX, torch.cat([header, *[p.data.flatten() for p in parts]]), n, k)

    @property
    def nbytes(self) -> int:
        """Bytes streamed by one matmul with this weight."""
        return self.data.numel() * self.data.element_size()

    @classmethod
    def from_blocks(cls, kind: str, blocks: torch.Tensor, out_features: int, in_features: int):
        """Pack ggml-ordered blocks (uint8, N · row_bytes bytes in any shape) of a block kind; q8_0g, mxfp4
        and a K-quant kind keep them as they are ([N, row_bytes], a view when `blocks` is contiguous)."""
        if kind in KQUANT_BYTES or kind in GGML_BLOCK_KINDS:
            step = row_bytes(kind, in_features)
            if blocks.dtype != torch.uint8 or blocks.numel() != out_features * step:
                raise ValueError(
                    f"{kind} blocks of a [{out_features}, {in_features}] weight: expected "
                    f"{out_features * step} uint8 bytes, found {blocks.numel()} {blocks.dtype}"
                )
            return cls(kind, blocks.reshape(out_features, step).contiguous(), out_features, in_features)
        return cls(kind, pack_blocks(kind, blocks, out_features, in_features), out_features, in_features)

    @classmethod
    def from_ggml(cls, type_name: str, raw: torch.Tensor, out_features: int, in_features: int):
        """A GGUF tensor's raw bytes (any shape, uint8 or the float dtype), used as stored: Q8_0 as q8_0g,
        the K-quants and MXFP4 as themselves (a view when `raw` is contiguous); Q4_0 / Q4_1 are packed (a
        copy of the same size); float types wrapped."""
        if type_name not in GGML_KINDS:
            raise ValueError(f"GGML type {type_name}: no kernel for it (supported: {sorted(GGML_KINDS)})")
        kind = AS_STORED.get(GGML_KINDS[type_name], GGML_KINDS[type_name])
        if kind in BLOCK_BYTES or kind in KQUANT_BYTES or kind in GGML_BLOCK_KINDS:
            return cls.from_blocks(kind, raw.view(torch.uint8), out_features, in_features)
        data = raw.view(FLOAT_KINDS[kind]).reshape(out_features, in_features)
        return cls(kind, data.contiguous(), out_features, in_features)

    def ggml_blocks(self) -> torch.Tensor:
        """A block weight's bytes in ggml order, uint8 [N, row_bytes] (what a GGUF file stores)."""
        if self.kind == KMIX:
            raise ValueError("a kmix weight has no single ggml layout: take each of parts()")
        if self.kind in KX_KINDS:
            from blazr.kernels import kquant_packed  # here: it imports this module

            return kquant_packed.unpack(self.kind, self.data, self.out_features, self.in_features)
        return (
            self.data if self.kind in KQUANT_BYTES or self.kind in GGML_BLOCK_KINDS else unpack_blocks(self)
        )


def _tile_fields(kind: str) -> tuple[int, int]:
    """(header bytes, quant bytes) of one packed tile (16 rows × one block)."""
    header = 64 if kind == "q4_1" else 32
    return header, ROW_GROUP * BLOCK_BYTES[kind] - header


def check_blocks(kind: str, blocks: torch.Tensor, out_features: int, in_features: int) -> None:
    """ValueError unless `blocks` holds exactly the uint8 bytes of an [N, K] weight of block kind `kind`."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"pack_blocks: kind {kind!r}, expected one of {BLOCK_KINDS}")
    n, nb, bs = out_features, in_features // QK, BLOCK_BYTES[kind]
    if n < 0 or in_features <= 0 or in_features % QK:
        raise ValueError(f"{kind} blocks of a [{n}, {in_features}] weight: in_features must be a positive "
                         f"multiple of {QK}, out_features ≥ 0")  # fmt: skip
    if blocks.dtype != torch.uint8 or blocks.numel() != n * nb * bs:
        raise ValueError(
            f"{kind} blocks of a [{n}, {in_features}] weight: expected {n * nb * bs} uint8 bytes, found "
            f"{blocks.numel()} {blocks.dtype}"
        )


def check_kquant_blocks(kind: str, blocks: torch.Tensor, out_features: int, in_features: int) -> None:
    """ValueError unless `blocks` holds exactly the uint8 bytes of an [N, K] weight of K-quant kind `kind`."""
    want = out_features * (in_features // QK_K) * KQUANT_BYTES[kind]
    if in_features <= 0 or in_features % QK_K or blocks.dtype != torch.uint8 or blocks.numel() != want:
        raise ValueError(
            f"{kind} blocks of a [{out_features}, {in_features}] weight: expected {want} uint8 bytes and "
            f"in_features a positive multiple of {QK_K}, found {blocks.numel()} {blocks.dtype}"
        )


def pack_blocks(kind: str, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """ggml-ordered blocks (N · row_bytes uint8) → the row-packed layout [G, 16 · row_bytes]: the C repack
    (csrc/pack.c) when the kernel library is available and the blocks are on the CPU, else
    `pack_blocks_reference` (the same bytes)."""
    check_blocks(kind, blocks, out_features, in_features)
    from blazr.kernels import ops  # here, not at the top: ops imports this module

    lib = ops.kernels() if blocks.is_cpu else None
    if lib is None:
        return pack_blocks_reference(kind, blocks, out_features, in_features)
    return lib.pack_blocks(kind, blocks, out_features, in_features)


def pack_blocks_reference(
    kind: str, blocks: torch.Tensor, out_features: int, in_features: int
) -> torch.Tensor:
    """`pack_blocks` in torch: rows padded to whole groups with zero rows, then moved by views."""
    check_blocks(kind, blocks, out_features, in_features)
    n, nb, bs = out_features, in_features // QK, BLOCK_BYTES[kind]
    g = -(-n // ROW_GROUP)
    rows = torch.zeros(g * ROW_GROUP, nb, bs, dtype=torch.uint8)
    rows[:n] = blocks.reshape(n, nb, bs)
    t = rows.view(g, ROW_GROUP, nb, bs).transpose(1, 2)  # [G, nb, 16, bs]
    header = 4 if kind == "q4_1" else 2  # per-row header bytes: d (and m)
    parts = [t[..., 0:2].reshape(g, nb, 32)]
    if kind == "q4_1":
        parts.append(t[..., 2:4].reshape(g, nb, 32))
    qs = t[..., header:]  # [G, nb, 16, 16 | 32]
    if kind == "q8_0":
        qs = qs ^ 0x80  # int8 + 128 as uint8 (vpdpbusd's unsigned operand)
    chunks = qs.reshape(g, nb, ROW_GROUP, (bs - header) // 4, 4).transpose(2, 3)  # [G, nb, chunk, 16 rows, 4]
    parts.append(chunks.reshape(g, nb, ROW_GROUP * (bs - header)))
    return torch.cat(parts, dim=-1).reshape(g, ROW_GROUP * nb * bs).contiguous()


def unpack_blocks(qw: QuantizedWeight) -> torch.Tensor:
    """The inverse of `pack_blocks`: uint8 [N, row_bytes] in ggml order."""
    kind, n, nb = qw.kind, qw.out_features, qw.in_features // QK
    g = qw.data.shape[0]
    header, qbytes = _tile_fields(kind)
    tiles = qw.data.view(g, nb, header + qbytes)
    parts = [tiles[..., 0:32].reshape(g, nb, ROW_GROUP, 2)]
    if kind == "q4_1":
        parts.append(tiles[..., 32:64].reshape(g, nb, ROW_GROUP, 2))
    qs = tiles[..., header:].reshape(g, nb, -1, ROW_GROUP, 4).transpose(2, 3).reshape(g, nb, ROW_GROUP, -1)
    parts.append(qs ^ 0x80 if kind == "q8_0" else qs)
    rows = torch.cat(parts, dim=-1).transpose(1, 2)  # [G, 16, nb, bs]
    return rows.reshape(g * ROW_GROUP, -1)[:n].contiguous()


def check_quantize(kind: str, w: torch.Tensor) -> None:
    """ValueError unless `w` is a 2-D weight [N, K] that block kind `kind` (or q8_0g) can quantize (K a
    positive multiple of 32)."""
    if kind not in BLOCK_BYTES and kind not in GGML_BLOCK_KINDS:
        known = (*BLOCK_KINDS, *GGML_BLOCK_KINDS, *FLOAT_KINDS)
        raise ValueError(
            f"quantize: kind {kind!r}, expected one of {known} (K-quant weights come from GGUF files, or "
            "random_kquant)"
        )
    if w.dim() != 2:
        raise ValueError(f"quantize: expected a 2-D weight [N, K], found shape {list(w.shape)}")
    if w.shape[1] <= 0 or w.shape[1] % QK:
        raise ValueError(f"quantize {kind}: in_features {w.shape[1]} is not a positive multiple of {QK}")


def quantize(w: torch.Tensor, kind: str) -> QuantizedWeight:
    """Quantize a float weight [N, K] to `kind` (ggml's rounding rules for the block kinds): the C quantizer
    (csrc/quantize.c, straight into the packed layout, or ggml's rows for q8_0g) when the kernel library is
    loaded and `w` is an f32 / bf16 / f16 CPU tensor, else `quantize_reference` (the same bytes; q8_0g:
    q8_0's bytes unpacked)."""
    if w.dim() != 2:
        raise ValueError(f"quantize: expected a 2-D weight [N, K], found shape {list(w.shape)}")
    n, k = w.shape
    if kind in FLOAT_KINDS:
        return QuantizedWeight(kind, w.detach().to("cpu", FLOAT_KINDS[kind]).contiguous(), n, k)
    check_quantize(kind, w)
    if kind in (
        MXFP4,
        Q5_0,
    ):  # gguf-py's quantizers, in torch (such weights come from checkpoints: for tests)
        return QuantizedWeight.from_blocks(kind, (mxfp4 if kind == MXFP4 else q5_0).quantize_blocks(w), n, k)
    from blazr.kernels import ops  # here, not at the top: ops imports this module
    from blazr.kernels.quant_reference import quantize_reference  # it imports this module

    lib = ops.kernels() if w.is_cpu and w.dtype in (torch.float32, torch.bfloat16, torch.float16) else None
    if lib is None and kind == Q8_0G:  # q8_0's bytes in ggml's order
        return QuantizedWeight.from_blocks(kind, quantize_reference(w, "q8_0").ggml_blocks(), n, k)
    if lib is None:
        return quantize_reference(w, kind)
    return QuantizedWeight(kind, lib.quantize_blocks(kind, w), n, k)


def block_fields(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Split a block weight into (d [N, nb] f32, m [N, nb] f32 or None, q [N, nb, 32]) with q the stored
    integers: int8 for q8_0 / q8_0g, 0..15 (uint8) for the 4-bit kinds — the offset −8 of q4_0 not applied —,
    for mxfp4 the int8 doubled e2m1 values kv with d = 2^(e − 128) (kernels/mxfp4.py), for q5_0 the int8
    values v = (q | h << 4) − 16 (the offset applied; kernels/q5_0.py)."""
    n, nb = qw.out_features, qw.in_features // QK
    if qw.kind == MXFP4:
        blocks = qw.data.view(n, nb, mxfp4.BLOCK_BYTES)
        return mxfp4.e8m0_half(blocks[..., 0]), None, mxfp4.values(blocks)
    if qw.kind == Q5_0:
        blocks = qw.data.view(n, nb, q5_0.BLOCK_BYTES)
        return q5_0.scales(blocks), None, q5_0.values(blocks)
    kind = "q8_0" if qw.kind == Q8_0G else qw.kind
    blocks = qw.ggml_blocks().view(n, nb, BLOCK_BYTES[kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
    m = None
    if kind == "q8_0":
        return d, m, blocks[..., 2:].contiguous().view(torch.int8)
    if qw.kind == "q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
    qs = blocks[..., 4:] if qw.kind == "q4_1" else blocks[..., 2:]
    return d, m, torch.cat((qs & 15, qs >> 4), dim=-1)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """float32 [N, K] (the reference every kernel is tested against); matches gguf.quants.dequantize."""
    if qw.kind == KMIX:
        return torch.cat([dequantize(p) for p in qw.parts()])
    if qw.kind in KX_KINDS:  # the stored kind's values
        from blazr.kernels.kquant_packed import BASE_OF

        n, k = qw.out_features, qw.in_features
        return dequantize(QuantizedWeight(BASE_OF[qw.kind], qw.ggml_blocks(), n, k))
    if qw.is_kquant:
        return kquant_fields.dequantize(qw)
    if qw.kind in CODED_KINDS:
        from blazr.kernels import coded

        return coded.unpack(qw.kind, qw.data, qw.out_features, qw.in_features).float()
    if qw.kind == MXFP4:
        return mxfp4.dequantize_blocks(qw.data).reshape(qw.out_features, qw.in_features)
    if qw.kind == Q5_0:
        return q5_0.dequantize_blocks(qw.data).reshape(qw.out_features, qw.in_features)
    if not qw.is_block:
        return qw.data.float()
    d, m, q = block_fields(qw)
    d = d.unsqueeze(-1)
    if qw.kind == "q4_0":
        w = d * (q.to(torch.int8) - 8).float()
    elif qw.kind == "q4_1":
        w = d * q.float() + m.unsqueeze(-1)
    else:
        w = d * q.float()
    return w.reshape(qw.out_features, qw.in_features)


# ---------------------------------------------------------------------------------------------------- kmix


def _kmix_segments(data: torch.Tensor) -> list[tuple[str, int]]:
    """A kmix weight's (kind, rows) segments, from the table at the start of its bytes."""
    names = {code: kind for kind, code in _KMIX_CODES.items()}
    if data.dim() != 1 or data.dtype != torch.uint8 or data.numel() < _KMIX_HEADER:
        raise ValueError(f"kmix weight data: expected 1-D uint8 with a {_KMIX_HEADER}-byte table first")
    table = data[: 4 * (1 + 2 * _KMIX_MAX)].clone().view(torch.int32).tolist()
    count, kinds, rows = table[0], table[1 : 1 + _KMIX_MAX], table[1 + _KMIX_MAX :]
    if not 1 <= count <= _KMIX_MAX or any(c not in names for c in kinds[:count]) or min(rows[:count]) < 0:
        raise ValueError(f"kmix weight: bad segment table {table}")
    return [(names[c], r) for c, r in zip(kinds[:count], rows[:count], strict=True)]
