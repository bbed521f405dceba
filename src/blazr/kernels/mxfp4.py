"""The `mxfp4` weight kind (OCP microscaling FP4), as llama.cpp's GGUF type MXFP4 (39) stores it — ggml's
`block_mxfp4`, 17 bytes per 32 values: the e8m0 scale byte e, then 16 bytes whose byte j holds element j's
e2m1 code in its low nibble and element j + 16's in its high one. A QuantizedWeight of this kind keeps those
bytes row after row, uint8 [N, K/32 · 17] (4.25 bits a value), never repacked: csrc/linear_mxfp4.c runs
them as stored.

Values, as ggml reads them (ggml-cpu's `ggml_vec_dot_mxfp4_q8_0`, gguf-py's `MXFP4`): a code's value doubled,
`KVALUES` = {0, 1, 2, 3, 4, 6, 8, 12, 0, −1, −2, −3, −4, −6, −8, −12} (code = sign << 3 | exponent << 1 |
mantissa), times the halved scale 2^(e − 128) (GGML_E8M0_TO_FP32_HALF: its subnormals for e < 2) — the OCP
value e2m1 · 2^(e − 127), exactly. The kernel's integers are those int8 `KVALUES` (block_fields).

HF checkpoints (GPT-OSS's `*_blocks` [*, G, 16] beside `*_scales` [*, G]) hold the same values with the
nibbles in another order — byte j holds element 2j low, 2j + 1 high —: `from_hf` re-lays them as GGUF
blocks (the bytes llama.cpp's converter writes), the only copy an HF checkpoint's experts take.

Here: `dequantize_blocks` (the float reference, gguf-py's values), `from_hf`, `quantize_blocks` (gguf-py's
quantizer, byte for byte: for weights made in tests and `quantize(w, "mxfp4")`), `random_blocks`.

Shapes: n blocks, G blocks per row, K = 32·G values a row.
"""

from __future__ import annotations

import torch

QK = 32  # values per block
BLOCK_BYTES = 17  # the scale byte + 16 bytes of nibbles
# the e2m1 codes' values, doubled (ggml's kvalues_mxfp4)
KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """Scale bytes e (uint8, any shape) → float32 2^(e − 128), bit for bit GGML_E8M0_TO_FP32_HALF."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e.clamp(max=1), (e - 1) << 23)
    return bits.view(torch.float32)


def codes(blocks: torch.Tensor) -> torch.Tensor:
    """GGUF blocks [..., 17] → the 32 codes of each (0..15, uint8 [..., 32]) in element order."""
    qs = blocks[..., 1:]
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def values(blocks: torch.Tensor) -> torch.Tensor:
    """GGUF blocks [..., 17] → the int8 values kv [..., 32] the kernel multiplies (doubled e2m1)."""
    return torch.tensor(KVALUES, dtype=torch.int8)[codes(blocks).long()]


def dequantize_blocks(raw: torch.Tensor) -> torch.Tensor:
    """GGUF MXFP4 bytes (n · 17 uint8, any shape) → float32 [n, 32]: 2^(e − 128) · kv, as gguf-py's
    `dequantize` and csrc/dequantize.c (the same bits)."""
    b = raw.view(torch.uint8).reshape(-1, BLOCK_BYTES)
    return e8m0_half(b[:, :1]) * values(b).float()


def from_hf(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF's packing — blocks [..., G, 16] uint8 (element 2j in byte j's low nibble, 2j + 1 in its high one),
    scales [..., G] uint8 — → GGUF blocks [..., G · 17] uint8 (the scale byte, then element j low and j + 16
    high): the same values."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks / scales: uint8 expected, found {blocks.dtype} / {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != QK // 2:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair")
    c = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., G, 32] codes in element order
    qs = c[..., :16] | (c[..., 16:] << 4)
    out = torch.cat([scales.unsqueeze(-1), qs], dim=-1)  # [..., G, 17]
    return out.flatten(-2).contiguous()


def quantize_blocks(w: torch.Tensor) -> torch.Tensor:
    """Float values (n · 32, any shape) → GGUF MXFP4 bytes [n, 17], gguf-py's `MXFP4.quantize_blocks` byte for
    byte: e = ⌊log2 amax⌋ − 2 + 127 (0 for a zero block), each value the code of the nearest d·kv (the first
    on ties, in code order)."""
    x = w.detach().float().reshape(-1, QK)
    amax = x.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax))
    e = e.to(torch.int64).to(torch.uint8)  # as numpy's float → uint8 cast of a value in 0..255
    d = e8m0_half(e)
    kv = torch.tensor(KVALUES, dtype=torch.float32)
    best = (d.unsqueeze(-1) * kv - x.unsqueeze(-1)).abs().argmin(-1).to(torch.uint8)  # [n, 32]
    return torch.cat([e, best[:, :16] | (best[:, 16:] << 4)], dim=-1)


def random_blocks(
    num_rows: int, in_features: int, g: torch.Generator, scale_lo: int = 118, scale_hi: int = 136
) -> torch.Tensor:
    """Random valid MXFP4 bytes of a [num_rows, in_features] weight, uint8 [N, K/32 · 17]: every code, scale
    bytes in [scale_lo, scale_hi) (2^−10 … 2^7 by default)."""
    n = num_rows * in_features // QK
    qs = torch.randint(0, 256, (n, 16), dtype=torch.uint8, generator=g)
    e = torch.randint(scale_lo, scale_hi, (n, 1), dtype=torch.uint8, generator=g)
    return torch.cat([e, qs], dim=-1).reshape(num_rows, -1)
