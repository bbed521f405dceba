"""MXFP4 weights (OCP microscaling FP4), as GPT-OSS's HF checkpoints and llama.cpp's GGUF type MXFP4 store
them: blocks of 32 values, each an e2m1 code (sign, 2 exponent bits, 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2,
3, 4, 6}) sharing one e8m0 scale 2^(e − 127).

Two byte layouts of the same values:
- HF (`*_blocks` [*, G, 16] uint8 beside `*_scales` [*, G] uint8): byte j of a block holds value 2j in its
  low nibble and value 2j + 1 in its high one;
- GGUF (type 39, 17 bytes a block): the scale byte e, then 16 bytes whose byte j holds value j in its low
  nibble and value j + 16 in its high one (ggml's Q4_0 order; llama.cpp's converter reorders the nibbles).

HF checkpoints: `*_blocks` / `*_scales` pairs are seen by the safetensors reader (loading/safetensors.py)
as one float tensor under the name without the suffix, in the layout transformers dequantizes them to
(`transformers.integrations.mxfp4.convert_moe_packed_tensors`: blocks [E, N, G, 16] → [E, G·32, N], the
last two dims swapped), so loading reads an MXFP4 checkpoint as it reads a float one.

Shapes: G blocks per row, N rows (output features), K = 32·G inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

BLOCK = 32  # values per block
BLOCK_BYTES = 17  # GGUF: one scale byte + 16 bytes of nibbles
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"
# the e2m1 codes' values, code = sign << 3 | exponent << 1 | mantissa
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _values(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """codes [..., G, 32] (0..15) and e8m0 exponents [..., G] → float32 [..., G, 32]."""
    lut = torch.tensor(E2M1, dtype=torch.float32)
    return torch.ldexp(lut[codes.long()], exponents.to(torch.int32)[..., None] - 127)


def dequantize_hf(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF's packing: blocks [..., G, 16] uint8 (value 2j in byte j's low nibble, 2j + 1 in its high one),
    scales [..., G] uint8 → float32 [..., G·32], rows as stored (no transpose)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair")
    b = blocks.to(torch.uint8)
    codes = torch.stack([b & 0x0F, b >> 4], dim=-1).flatten(-2)  # [..., G, 32]
    return _values(codes, scales).flatten(-2)


def dequantize_hf_transposed(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """As transformers dequantizes GPT-OSS's experts: blocks [E, N, G, 16] → [E, 32·G, N] float32."""
    return dequantize_hf(blocks, scales).transpose(1, 2).contiguous()


def dequantize_gguf(raw: torch.Tensor) -> torch.Tensor:
    """GGUF MXFP4 blocks [n, 17] uint8 (scale byte, then value j in byte j's low nibble and j + 16 in its
    high one) → float32 [n, 32]."""
    b = raw.view(torch.uint8).reshape(-1, BLOCK_BYTES)
    qs = b[:, 1:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [n, 32]
    return _values(codes, b[:, 0])


def quantize_hf(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float rows w [..., K] (K a multiple of 32) → (blocks [..., K/32, 16], scales [..., K/32]) in HF's
    packing: per block the scale 2^e is the smallest power of two with amax / 2^e ≤ 6, each value the
    nearest e2m1 code (ties to the lower magnitude). For making test checkpoints; exact on values that
    already are MXFP4."""
    x = w.float().unflatten(-1, (-1, BLOCK))  # [..., G, 32]
    amax = x.abs().amax(-1).clamp(min=2.0**-126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    y = x / torch.exp2(e)[..., None]
    mags = torch.tensor(E2M1[:8])
    code = (y.abs()[..., None] - mags).abs().argmin(-1)  # nearest magnitude
    code = code | ((y < 0).long() << 3)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks, (e + 127).to(torch.uint8)


class _Entry(Protocol):
    dtype: torch.dtype
    shape: tuple[int, ...]


def paired(entries: Mapping[str, _Entry]) -> dict[str, tuple[str, str]]:
    """The MXFP4 tensors among a safetensors file's entries: {name: (blocks name, scales name)} for every
    uint8 `name_blocks` [E, N, G, 16] with a uint8 `name_scales` [E, N, G] (GPT-OSS's experts)."""
    found = {}
    for name, e in entries.items():
        if not name.endswith(BLOCKS_SUFFIX) or e.dtype != torch.uint8 or len(e.shape) != 4:
            continue
        base = name.removesuffix(BLOCKS_SUFFIX)
        s = entries.get(base + SCALES_SUFFIX)
        if s is not None and s.dtype == torch.uint8 and tuple(s.shape) == tuple(e.shape[:-1]):
            found[base] = (name, base + SCALES_SUFFIX)
    return found


def hf_shape(blocks_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `dequantize_hf_transposed` gives for blocks of `blocks_shape` [E, N, G, 16]: [E, 32·G, N]."""
    E, N, G, _ = blocks_shape
    return (E, G * BLOCK, N)
