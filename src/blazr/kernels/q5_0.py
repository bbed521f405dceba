"""The `q5_0` weight kind, as a GGUF stores GGML type Q5_0 (6) — ggml's `block_q5_0`, 22 bytes per 32 values:
the f16 scale d, 4 bytes qh (bit j: element j's fifth bit, little-endian), then 16 bytes whose byte j holds
element j's low four bits in its low nibble and element j + 16's in its high one. A QuantizedWeight of this
kind keeps those bytes row after row, uint8 [N, K/32 · 22] (5.5 bits a value), never repacked:
csrc/linear_b32.c runs them as stored.

llama.cpp's K-quant mixes (Q4_K_M …) fall back to Q5_0 for a tensor whose rows are no multiple of 256 values
— Gemma 3 270M / 1B (640, 1152), Qwen2.5-0.5B (896) —, so such files are mostly Q5_0.

Values, as ggml reads them (ggml-cpu's `ggml_vec_dot_q5_0_q8_0`, gguf-py's `Q5_0`): v = (q | h << 4) − 16, an
int8 in −16 … 15, times d widened to fp32: w = d·v. The kernel's integers are those v (`values`).

Here: `values`, `dequantize_blocks` (the float reference, gguf-py's values), `random_blocks` (valid blocks
for tests and benchmarks). Quantizing float weights to Q5_0 is gguf-py's (tests use `gguf.quants.quantize`).

Shapes: n blocks, G blocks per row, K = 32·G values a row.
"""

from __future__ import annotations

import torch

QK = 32  # values per block
BLOCK_BYTES = 22  # f16 d, 4 bytes of fifth bits, 16 bytes of low nibbles


def scales(blocks: torch.Tensor) -> torch.Tensor:
    """Blocks [..., 22] uint8 → d [...] float32 (the f16 widened: exact)."""
    return blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)


def values(blocks: torch.Tensor) -> torch.Tensor:
    """Blocks [..., 22] uint8 → the int8 values v [..., 32] the kernel multiplies, in element order."""
    qs = blocks[..., 6:22]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=-1).to(torch.int16)  # [..., 32]
    qh = blocks[..., 2:6].to(torch.int64)
    word = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
    high = (word.unsqueeze(-1) >> torch.arange(QK)) & 1
    return (low | (high.to(torch.int16) << 4)).sub(16).to(torch.int8)


def dequantize_blocks(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q5_0 bytes (n · 22 uint8, any shape) → float32 [n, 32]: d · v, as gguf-py's `dequantize`,
    loading/gguf.py's `_q5_0` and csrc/dequantize.c (the same bits)."""
    b = raw.view(torch.uint8).reshape(-1, BLOCK_BYTES)
    return scales(b).unsqueeze(-1) * values(b).float()


def random_blocks(n: int, k: int, g: torch.Generator, scale: float = 0.02) -> torch.Tensor:
    """Valid random Q5_0 blocks of an [n, k] weight, uint8 [n, k/32 · 22]: finite f16 scales around `scale`
    (either sign), every bit pattern of qh and the nibbles."""
    nb = k // QK
    d = (
        (torch.rand(n, nb, generator=g) + 0.05)
        * scale
        * torch.where(torch.rand(n, nb, generator=g) < 0.5, -1, 1)
    )
    bits = torch.randint(0, 256, (n, nb, 20), dtype=torch.uint8, generator=g)
    d16 = d.to(torch.float16).view(torch.uint8).reshape(n, nb, 2)
    return torch.cat([d16, bits], dim=-1).reshape(n, nb * BLOCK_BYTES)


def quantize_blocks(w: torch.Tensor) -> torch.Tensor:
    """A float weight [N, K] → Q5_0 blocks uint8 [N, K/32 · 22], gguf-py's quantizer byte for byte: per block
    d = x[argmax |x|] / −16 (fp32), q = trunc(fp32(x·(1/d) + 16.5)) (the product and sum in float64), clipped
    to 0 … 31."""
    n, k = w.shape
    blocks = w.detach().to("cpu", torch.float32).reshape(-1, QK)
    imax = blocks.abs().argmax(-1, keepdim=True)
    d = blocks.gather(-1, imax) / -16
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = (blocks.double() * inv.double() + 16.5).float().trunc().clamp(0, 31).to(torch.uint8)
    qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)
    bits = (q >> 4).to(torch.int64) << torch.arange(QK)
    word = bits.sum(-1, keepdim=True)
    qh = torch.cat([(word >> s) & 0xFF for s in (0, 8, 16, 24)], dim=-1).to(torch.uint8)
    d16 = d.to(torch.float16).view(torch.uint8)
    return torch.cat([d16, qh, qs], dim=-1).reshape(n, k // QK * BLOCK_BYTES)
