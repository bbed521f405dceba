"""Plain-torch references of the kernel operations — the readable definition each C kernel is tested
against, and the path blazr takes when the library is unavailable (`BLAZR_KERNELS=0`, no compiler) or an
input is unsupported. Same signatures as the dispatching functions in `ops.py`, which re-exports them.

`int8_dot_reference` additionally emulates the block-quantized linear kernel's integer algorithm in exact
arithmetic (its test oracle); `quantize_act_reference` is that kernel's activation quantization.

Shapes: M rows, K in features, N out features (SwiGLU: N = 2·I); T tokens, H / Hkv heads, D / Dv head
dims, R rotary dims, P table rows; B sequences, S cache slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.quant import QK, QuantizedWeight, block_fields, dequantize


def linear_out_features(qw: QuantizedWeight, swiglu: bool) -> int:
    """Output width of a linear layer: N, or N/2 for the SwiGLU form (N must then be even)."""
    if swiglu and qw.out_features % 2:
        raise ValueError(f"SwiGLU linear: weight has {qw.out_features} rows, expected an even [gate; up]")
    return qw.out_features // 2 if swiglu else qw.out_features


def linear_reference(
    x: torch.Tensor,
    qw: QuantizedWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 matmul with the dequantized weight, then the epilogue (bias, SwiGLU or residual)."""
    linear_out_features(qw, swiglu)
    y = F.linear(x.float(), dequantize(qw), bias)
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = y + residual
    if out is not None:
        return out.copy_(y)
    return y


def quantize_act_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Activation quantization of the block linear kernel — ggml's x86 quantize_row_q8_0 / q8_1 — per row
    and block of 32, in fp32: amax = max|x|, d = fp16(amax/127), q = round_half_even(x · (127/amax))
    (0 where amax = 0), s = fp16(amax/127 · Σq). x [M, K] → q int8 [M, K], d [M, K/32], s [M, K/32]."""
    M, K = x.shape
    xb = x.float().reshape(M, K // QK, QK)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax == 0, torch.zeros_like(amax), 127 / amax)
    q = torch.round(xb * inv.unsqueeze(-1)).clamp(-128, 127)
    d = amax / 127
    s = (d * q.sum(-1)).half().float()
    return q.to(torch.int8).reshape(M, K), d.half().float(), s


def int8_dot_reference(x: torch.Tensor, qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Emulate the block linear kernel's dot products x · Wᵀ in exact (float64) arithmetic: activations
    quantized by `quantize_act_reference`, exact integer block dots, fp32 per-block scales dw·dx.
    Returns (y [M, N] float64, mag [M, N] float64 = Σ over blocks of |scale·dot| (+ |m·s|)), so the C
    kernel must agree with y to within fp32 summation rounding of mag."""
    M, K = x.shape
    nb = K // QK
    qx, dx, sx = quantize_act_reference(x)
    dw, mw, qint = block_fields(qw)
    wq = qint.double() - (8 if qw.kind == "q4_0" else 0)  # [N, nb, 32]
    dots = torch.einsum("mbk,nbk->mnb", qx.double().reshape(M, nb, QK), wq)  # exact integers
    terms = (dw.unsqueeze(0) * dx.unsqueeze(1)).double() * dots  # fp32 scale, as the kernel
    y, mag = terms.sum(-1), terms.abs().sum(-1)
    if mw is not None:
        mterms = torch.einsum("nb,mb->mnb", mw.double(), sx.double())
        y, mag = y + mterms.sum(-1), mag + mterms.abs().sum(-1)
    return y, mag


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    xf = x.float()
    y = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    return y if out is None else out.copy_(y)


def rope_neox_reference(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int
) -> torch.Tensor:
    """In place on x [T, H, Dh]: rotate the first rot_dim features of each head (half-split layout)."""
    half = rot_dim // 2
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [T, 1, R/2]
    x1, x2 = x[..., :half].clone(), x[..., half:rot_dim].clone()
    x[..., :half] = x1 * c - x2 * s
    x[..., half:rot_dim] = x2 * c + x1 * s
    return x


def paged_attention_decode_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    scale: float,
    *,
    window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per sequence: gather its keys from the pools, softmax(scale · q·kᵀ) · v in fp32; keys
    [L − window, L) with a window; no keys → zeros."""
    B, H, _ = q.shape
    G = H // k_pool.shape[1]
    res = torch.zeros(B, H, v_pool.shape[2], dtype=torch.float32)
    for b in range(B):
        L = int(seq_lens[b])
        start = max(0, L - window) if window else 0
        if start >= L:
            continue
        idx = kv_indices[b, start:L]
        k = k_pool[idx].float().repeat_interleave(G, dim=1)  # [n, H, D]
        v = v_pool[idx].float().repeat_interleave(G, dim=1)
        p = (torch.einsum("hd,nhd->hn", q[b].float(), k) * scale).softmax(-1)
        res[b] = torch.einsum("hn,nhd->hd", p, v)
    return res if out is None else out.copy_(res)


def kv_write_reference(
    k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor
) -> None:
    """k_pool[slot_mapping[t]] = k[t], v_pool[slot_mapping[t]] = v[t] (cast to the pools' dtype)."""
    k_pool.index_copy_(0, slot_mapping, k.to(k_pool.dtype))
    v_pool.index_copy_(0, slot_mapping, v.to(v_pool.dtype))
