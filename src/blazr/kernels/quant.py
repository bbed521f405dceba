"""Weight formats of the kernel library: `QuantizedWeight`, and the torch references `quantize` /
`dequantize`.

Block formats use ggml's exact byte layout, so a GGUF tensor is used as-is (its uint8 bytes viewed as
[N, row_bytes]); 32 weights per block, row_bytes = K/32 · block_bytes:
- q4_0 (18 B): f16 d, 16 B nibbles — w = d·(q − 8)
- q4_1 (20 B): f16 d, f16 m, 16 B nibbles — w = d·q + m
- q8_0 (34 B): f16 d, 32 int8 — w = d·q
Nibble byte j holds element j (low half) and element j + 16 (high half). Float kinds keep a torch tensor:
bf16 or f32 [N, K].

`quantize` reproduces gguf's numpy quantizers (`gguf.quants`, bit-exact with ggml's reference C
quantizers) byte for byte; `dequantize` reproduces `gguf.quants.dequantize`.

Shapes: N = out_features, K = in_features.
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


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A linear layer's weight [N, K] in one of `KINDS`.

    `data` is uint8 [N, K/32 · block_bytes] for block kinds (ggml layout), else a bf16 / f32 tensor
    [N, K]. It must be contiguous; the C kernels read it in place."""

    kind: str
    data: torch.Tensor
    out_features: int
    in_features: int

    def __post_init__(self) -> None:
        n, k, d = self.out_features, self.in_features, self.data
        if self.kind in BLOCK_BYTES:
            if k % QK:
                raise ValueError(f"{self.kind} weight: in_features {k} is not a multiple of {QK}")
            want, dtype = (n, k // QK * BLOCK_BYTES[self.kind]), torch.uint8
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
    def from_ggml(cls, type_name: str, raw: torch.Tensor, out_features: int, in_features: int):
        """Wrap a GGUF tensor's raw bytes (any shape, uint8 or the float dtype) without copying."""
        if type_name not in GGML_KINDS:
            raise ValueError(f"GGML type {type_name}: no kernel for it (supported: {sorted(GGML_KINDS)})")
        kind = GGML_KINDS[type_name]
        if kind in BLOCK_BYTES:
            data = raw.view(torch.uint8).reshape(out_features, -1)
        else:
            data = raw.view(FLOAT_KINDS[kind]).reshape(out_features, in_features)
        return cls(kind, data.contiguous(), out_features, in_features)


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
    data = torch.cat(parts, dim=-1).reshape(n, -1)
    return QuantizedWeight(kind, data, n, k)


def block_fields(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Split a block weight into (d [N, nb] f32, m [N, nb] f32 or None, q [N, nb, 32]) with q the stored
    integers: int8 for q8_0, 0..15 (uint8) for the 4-bit kinds — the offset −8 of q4_0 not applied."""
    n, nb = qw.out_features, qw.in_features // QK
    blocks = qw.data.view(n, nb, BLOCK_BYTES[qw.kind])
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
