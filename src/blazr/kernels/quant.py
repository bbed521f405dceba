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
exactly. Float kinds keep a torch tensor: bf16 or f32 [N, K].

`quantize` reproduces gguf's numpy quantizers (`gguf.quants`, bit-exact with ggml's reference C
quantizers) byte for byte; `dequantize` reproduces `gguf.quants.dequantize`.

Shapes: N = out_features, K = in_features, nb = K/32 blocks per row, G = ⌈N/16⌉ row groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32  # weights per block
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
BLOCK_KINDS = tuple(BLOCK_BYTES)
FLOAT_KINDS = {"bf16": torch.bfloat16, "f32": torch.float32}
KINDS = (*BLOCK_KINDS, *FLOAT_KINDS)
# GGML tensor type names (gguf.GGMLQuantizationType.name) that map onto a kind.
GGML_KINDS = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0", "BF16": "bf16", "F32": "f32"}


ROW_GROUP = 16  # rows per packed group


def _group_bytes(kind: str, in_features: int) -> int:
    return ROW_GROUP * in_features // QK * BLOCK_BYTES[kind]


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A linear layer's weight [N, K] in one of `KINDS`.

    `data` is uint8 [G, 16 · row_bytes] for block kinds (row-packed, see the module docstring; build one
    from ggml-ordered blocks with `from_blocks`), else a bf16 / f32 tensor [N, K]. It must be contiguous;
    the C kernels read it in place."""

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
        return self.kind in BLOCK_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes streamed by one matmul with this weight."""
        return self.data.numel() * self.data.element_size()

    @classmethod
    def from_blocks(cls, kind: str, blocks: torch.Tensor, out_features: int, in_features: int):
        """Pack ggml-ordered blocks (uint8, N · row_bytes bytes in any shape) of a block kind."""
        return cls(kind, pack_blocks(kind, blocks, out_features, in_features), out_features, in_features)

    @classmethod
    def from_ggml(cls, type_name: str, raw: torch.Tensor, out_features: int, in_features: int):
        """A GGUF tensor's raw bytes (any shape, uint8 or the float dtype): block types are packed (a copy
        of the same size), float types wrapped."""
        if type_name not in GGML_KINDS:
            raise ValueError(f"GGML type {type_name}: no kernel for it (supported: {sorted(GGML_KINDS)})")
        kind = GGML_KINDS[type_name]
        if kind in BLOCK_BYTES:
            return cls.from_blocks(kind, raw.view(torch.uint8), out_features, in_features)
        data = raw.view(FLOAT_KINDS[kind]).reshape(out_features, in_features)
        return cls(kind, data.contiguous(), out_features, in_features)

    def ggml_blocks(self) -> torch.Tensor:
        """A block weight's bytes in ggml order, uint8 [N, row_bytes] (what a GGUF file stores)."""
        return unpack_blocks(self)


def _tile_fields(kind: str) -> tuple[int, int]:
    """(header bytes, quant bytes) of one packed tile (16 rows × one block)."""
    header = 64 if kind == "q4_1" else 32
    return header, ROW_GROUP * BLOCK_BYTES[kind] - header


def pack_blocks(kind: str, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """ggml-ordered blocks (N · row_bytes uint8) → the row-packed layout [G, 16 · row_bytes]."""
    n, nb, bs = out_features, in_features // QK, BLOCK_BYTES[kind]
    if blocks.dtype != torch.uint8 or blocks.numel() != n * nb * bs or in_features % QK:
        raise ValueError(
            f"{kind} blocks of a [{n}, {in_features}] weight: expected {n * nb * bs} uint8 bytes, found "
            f"{blocks.numel()} {blocks.dtype}"
        )
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
    chunks = qs.reshape(g, nb, ROW_GROUP, -1, 4).transpose(2, 3)  # [G, nb, chunk, 16 rows, 4]
    parts.append(chunks.reshape(g, nb, -1))
    return torch.cat(parts, dim=-1).reshape(g, -1).contiguous()


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


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """gguf's np_roundf: round half away from zero, computed the same way."""
    a = v.abs()
    fl = a.floor()
    return v.sign() * (fl + (2 * (a - fl)).floor())


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [n, 32] uint8 in 0..15 → [n, 16] bytes: element j low, element j + 16 high."""
    return q[:, :16] | (q[:, 16:] << 4)


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float16).view(torch.uint8)  # [n, 1] f16 → [n, 2]


def quantize(w: torch.Tensor, kind: str) -> QuantizedWeight:
    """Quantize a float weight [N, K] to `kind` (ggml's rounding rules for the block kinds)."""
    if w.dim() != 2:
        raise ValueError(f"quantize: expected a 2-D weight [N, K], found shape {list(w.shape)}")
    n, k = w.shape
    if kind in FLOAT_KINDS:
        return QuantizedWeight(kind, w.detach().to("cpu", FLOAT_KINDS[kind]).contiguous(), n, k)
    if kind not in BLOCK_BYTES:
        raise ValueError(f"quantize: kind {kind!r}, expected one of {KINDS}")
    if k % QK:
        raise ValueError(f"quantize {kind}: in_features {k} is not a multiple of {QK}")
    blocks = w.detach().to("cpu", torch.float32).reshape(-1, QK)  # [n·K/32, 32]
    if kind == "q8_0":
        d = blocks.abs().amax(-1, keepdim=True) / 127
        q = _round_half_away(blocks * _inverse(d)).to(torch.int8).view(torch.uint8)
        parts = [_f16_bytes(d), q]
    elif kind == "q4_0":
        imax = blocks.abs().argmax(-1, keepdim=True)  # first occurrence, as numpy
        d = blocks.gather(-1, imax) / -8
        q = (blocks * _inverse(d) + 8.5).trunc().clamp(0, 15).to(torch.uint8)
        parts = [_f16_bytes(d), _pack_nibbles(q)]
    else:  # q4_1
        mx, mn = blocks.amax(-1, keepdim=True), blocks.amin(-1, keepdim=True)
        d = (mx - mn) / 15
        q = ((blocks - mn) * _inverse(d) + 0.5).trunc().clamp(0, 15).to(torch.uint8)
        parts = [_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(q)]
    return QuantizedWeight.from_blocks(kind, torch.cat(parts, dim=-1), n, k)


def block_fields(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Split a block weight into (d [N, nb] f32, m [N, nb] f32 or None, q [N, nb, 32]) with q the stored
    integers: int8 for q8_0, 0..15 (uint8) for the 4-bit kinds — the offset −8 of q4_0 not applied."""
    n, nb = qw.out_features, qw.in_features // QK
    blocks = unpack_blocks(qw).view(n, nb, BLOCK_BYTES[qw.kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
    m = None
    if qw.kind == "q8_0":
        return d, m, blocks[..., 2:].contiguous().view(torch.int8)
    if qw.kind == "q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
    qs = blocks[..., 4:] if qw.kind == "q4_1" else blocks[..., 2:]
    return d, m, torch.cat((qs & 15, qs >> 4), dim=-1)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """float32 [N, K] (the reference every kernel is tested against); matches gguf.quants.dequantize."""
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
