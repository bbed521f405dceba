"""`quantize_reference`: kernels/quant.py's `quantize` in torch — gguf's numpy quantizers' operations
(`gguf.quants`, bit-exact with ggml's reference C quantizers) on fp32 blocks of 32, for q8_0, q4_0 and q4_1
(q8_0g: q8_0's bytes in ggml's order). The C quantizer (csrc/quantize.c) writes the same bytes
(tests/test_quantize_kernel.py).

Shapes: w [N, K] float, K a multiple of 32 → a QuantizedWeight [N, K].
"""

from __future__ import annotations

import torch

from blazr.kernels.quant import FLOAT_KINDS, MXFP4, Q5_0, Q8_0G, QK, QuantizedWeight, check_quantize, quantize


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


def quantize_reference(w: torch.Tensor, kind: str) -> QuantizedWeight:
    """`quantize` in torch: gguf's numpy quantizers' operations on fp32 blocks of 32, then `from_blocks`."""
    if kind in FLOAT_KINDS:
        return quantize(w, kind)
    if kind in (MXFP4, Q5_0):
        return quantize(w, kind)  # torch either way
    if kind == Q8_0G:
        return QuantizedWeight.from_blocks(kind, quantize_reference(w, "q8_0").ggml_blocks(), *w.shape)
    check_quantize(kind, w)
    n, k = w.shape
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
