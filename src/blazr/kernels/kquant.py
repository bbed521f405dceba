"""K-quant tools beside the weight format (kernels/quant.py): `quantize_q8_k`, the K-quant kernels'
activation rounding (ggml's Q8_K, the references' view of x), and `random_kquant`, K-quant weights of random
bytes (`random_bytes`) for tests and benchmarks (ggml's K-quant quantizers search scales iteratively; real
K-quant weights come from llama.cpp's quantizer).

Shapes: x [M, K] with K a multiple of 256; a weight [N, K] holds K/256 super-blocks per row.
"""

from __future__ import annotations

import math

import torch

from blazr.kernels.quant import K_KINDS, KQUANT_BYTES, QK_K, QuantizedWeight


def random_kquant(
    kind: str, out_features: int, in_features: int, generator: torch.Generator, d: float = 2e-4
) -> QuantizedWeight:
    """A K-quant weight of random bytes — every quant, scale and min over its whole range — with f16 d
    (and dmin) drawn from [d/2, 3d/2) (for tests and benchmarks; any bytes but non-finite f16 fields make a
    valid super-block)."""
    if kind not in KQUANT_BYTES:
        raise ValueError(f"random_kquant: kind {kind!r}, expected one of {K_KINDS}")
    n, bs = out_features * (in_features // QK_K), KQUANT_BYTES[kind]
    blocks = random_bytes((n, bs), generator)
    scale = (torch.rand(n, 2, generator=generator) + 0.5) * d
    f16 = scale.half().view(torch.uint8)  # [n, 4]
    if kind == "q6_k":
        blocks[:, 208:210] = f16[:, 0:2]
    else:
        blocks[:, 0:4] = f16
    return QuantizedWeight.from_blocks(kind, blocks, out_features, in_features)


def random_bytes(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Uniformly random uint8 bytes of `shape`, drawn eight at a time as int64 (a uint8 draw makes one byte
    a call: ~3.5x slower, which host tuning's hundreds of MB of weights felt)."""
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, (-(-n // 8),), dtype=torch.int64, generator=generator)
    return words.view(torch.uint8)[:n].view(shape)


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The K-quant kernels' activation rounding (ggml's quantize_row_q8_K_ref, Q8_K), per row and block of
    256 in fp32: max = the first element of largest |x|, iscale = −127/max, q = round_half_even(iscale·x)
    (±127), d = 1/iscale (0 and q = 0 where max = 0), bsums = Σ q per 16.
    x [M, K] → q int8 [M, K], d [M, K/256] f32, bsums [M, K/16] int32. Then x ≈ d·q with
    |x − d·q| ≤ |d|·(½ + 2⁻¹⁴) per element."""
    M, K = x.shape
    xb = x.float().reshape(M, K // QK_K, QK_K)
    imax = xb.abs().argmax(-1, keepdim=True)  # first occurrence of the largest |x|
    mx = xb.gather(-1, imax)
    # true divisions (a python number over a tensor is a reciprocal times the number in torch: other bits)
    iscale = torch.where(mx == 0, torch.zeros_like(mx), torch.full_like(mx, -127.0).div(mx))
    q = torch.round(xb * iscale).clamp(-127, 127)
    d = torch.where(mx == 0, torch.zeros_like(mx), torch.ones_like(mx).div(iscale)).squeeze(-1)
    bsums = q.reshape(M, -1, 16).sum(-1).to(torch.int32)
    return q.to(torch.int8).reshape(M, K), d, bsums.reshape(M, K // 16)
