"""Plain-torch references of the kernel operations — the readable definition each C kernel is tested
against, and the path blazr takes when the library is unavailable (`BLAZR_KERNELS=0`, no compiler) or an
input is unsupported. Same signatures as the dispatching functions in `ops.py`, which re-exports them.
This file holds the linear, norm, embedding, elementwise / activation, RoPE and attention references; the
other families have their own: `reference_mamba2.py` (SSD step, Mamba2 decode step and prefill),
`reference_moe_mla.py` (MoE router and experts, MLA cache write and decode, per-head linear),
`reference_conv.py`, `reference_deltanet.py`, `reference_kda.py`, `reference_mamba1.py`,
`reference_sample.py`.

`int8_dot_reference` additionally emulates the block-quantized linear kernel's integer algorithm in exact
arithmetic (its test oracle); `quantize_act_reference` is that kernel's activation quantization.

Shapes: M rows, K in features, N out features (SwiGLU: N = 2·I); T tokens, H / Hkv heads, D / Dv head
dims, R rotary dims, P table rows; B sequences, S cache slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels import formats
from blazr.kernels.kquant import quantize_q8_k
from blazr.kernels.quant import (
    KMIX,
    KX_KINDS,
    QK,
    QK_K,
    QuantizedWeight,
    block_fields,
    dequantize,
)
from blazr.kernels.reference_attention import attention_prefill_reference
from blazr.kernels.row_table import RowTable


def linear_out_features(qw: QuantizedWeight, swiglu: bool) -> int:
    """Output width of a linear layer: N, or N/2 for the SwiGLU form (N must then be even; for a kind in
    16-row groups, each half whole groups)."""
    if swiglu and qw.out_features % 2:
        raise ValueError(f"SwiGLU linear: weight has {qw.out_features} rows, expected an even [gate; up]")
    if swiglu and qw.kind in KX_KINDS and qw.out_features % 32:
        raise ValueError(f"SwiGLU linear: a {qw.kind} weight's halves of {qw.out_features // 2} rows do not "
                         "fill 16-row groups")  # fmt: skip
    return qw.out_features // 2 if swiglu else qw.out_features


def check_exact_x(qw: QuantizedWeight, exact_x: bool) -> None:
    """`exact_x` (x kept fp32 by the kernel) is asked of a kind whose format has it, or refused."""
    if exact_x and not formats.of(qw.kind).exact_x:
        known = ", ".join(f.kind for f in formats.FORMATS if f.exact_x)
        raise ValueError(f"linear: exact_x is not offered by kind {qw.kind} (only {known})")


def _kernel_input(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x [..., K] as fp32, rounded as a K-quant kernel rounds it (`quantize_q8_k`: x̂ = d·q per 256)."""
    if not qw.is_kquant:
        return x.float()
    q, d, _ = quantize_q8_k(x.reshape(-1, qw.in_features))
    return (q.float().unflatten(-1, (-1, QK_K)) * d.unsqueeze(-1)).reshape(x.shape)


def linear_reference(
    x: torch.Tensor,
    qw: QuantizedWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
    out: torch.Tensor | None = None,
    prefill: bool = False,
    exact_x: bool = False,
) -> torch.Tensor:
    """fp32 matmul with the dequantized weight, then the epilogue (bias, SwiGLU or residual). (`prefill`
    chooses among the kernel's paths, `exact_x` between x rounded to 8 bits or kept fp32 by a Q8_0 kernel;
    the reference has one: x as given.)

    A kmix weight with 32-block segments: each segment's rows by this rule. K-quant weights (q4_k / q5_k /
    q6_k, a kmix of them) see x rounded as their kernel rounds it (`quantize_q8_k`: 8 bits
    per 256, an f32 scale): x̂ = d·q. The kernel then differs from this reference only by fp32 rounding —
    of the dequantized weight and x̂ here (≤ 2u·|w|, u·|x̂| per element), of its per-super-block scales and
    sums there — within γ_{K/256·2+8}·Σ|x̂|·(|d·sc·q| + |dmin·m|) + γ_K·Σ|x̂·w|; against the unrounded x
    add Σ_blocks |d|·(½ + 2⁻¹⁴)·Σ_block |w|."""
    linear_out_features(qw, swiglu)
    check_exact_x(qw, exact_x)
    if (
        qw.kind == KMIX and not qw.is_kquant
    ):  # segments of 32-block kinds too: each sees its own rounding of x
        y = torch.cat([F.linear(_kernel_input(x, p), dequantize(p)) for p in qw.parts()], dim=-1)
        y = y if bias is None else y + bias
    else:
        y = F.linear(_kernel_input(x, qw), dequantize(qw), bias)
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
    # a tensor divisor: `127 / amax` runs as reciprocal(amax) · 127, one ulp off ggml's 127.f / amax at times
    inv = torch.where(amax == 0, torch.zeros_like(amax), torch.full_like(amax, 127.0) / amax)
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


def gated_rms_norm_reference(
    y: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor | None,
    group_size: int,
    eps: float,
    norm_before_gate: bool,
) -> torch.Tensor:
    """Mamba2's gated RMSNorm over groups of `group_size` features: weight · RMSNorm(y · silu(z)), or
    weight · RMSNorm(y) · silu(z) when `norm_before_gate`. Statistics in float32, cast back to y's dtype
    before the weight (as HF's MambaRMSNormGated). y, z [..., D]; weight [D], or None for the gate alone:
    y · silu(z) in float32 (FalconH1 without its Mamba norm)."""
    if weight is None:
        return y.float() * F.silu(z.float())
    dtype = y.dtype
    yf = y.float()
    if not norm_before_gate:
        yf = yf * F.silu(z.float())
    g = yf.unflatten(-1, (-1, group_size))  # [..., G, D/G]
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    yf = g.flatten(-2)
    if norm_before_gate:
        yf = yf * F.silu(z.float())
    return weight * yf.to(dtype)


def embedding_reference(
    ids: torch.Tensor, table: torch.Tensor, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows `ids` [T] of table [V, D], times scale: [T, D]."""
    y = table[ids]
    if scale != 1.0:
        y = y * scale
    return y if out is None else out.copy_(y)


def embedding_rows_reference(
    ids: torch.Tensor, table: RowTable, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows `ids` [T] of a table kept in a GGUF's row layout, dequantized (`dequantize`), times scale:
    [T, D] float32 — what `embedding_reference` gives on the dequantized table."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.num_rows):
        raise IndexError(f"embedding_rows: an id outside [0, {table.num_rows})")
    return embedding_reference(torch.arange(ids.numel()), dequantize(table.rows(ids)), scale, out)


ACTIVATIONS = ("silu", "gelu", "relu2", "gelu_erf", "swiglu_oai")  # kernel codes 0 … 4


def oai_glu_reference(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU: (clamp(up, −limit, limit) + 1) · g · sigmoid(alpha · g), g = min(gate,
    limit) — transformers' GptOssExperts._apply_gate on de-interleaved halves."""
    g = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (g * torch.sigmoid(g * alpha))


def activation_reference(
    x: torch.Tensor, kind: str, gated: bool, alpha: float = 1.702, limit: float = 7.0
) -> torch.Tensor:
    """An MLP activation (silu, gelu = tanh approximation, gelu_erf = exact, relu2 = relu(x)²) of
    x [..., N]; gated: of the first half, times the second (the [gate; up] halves of a fused projection)
    → [..., N/2]; swiglu_oai (gated only): `oai_glu_reference` of the halves with `alpha`, `limit`."""
    if kind == "swiglu_oai":
        gate, up = x.chunk(2, dim=-1)
        return oai_glu_reference(gate, up, alpha, limit)
    h = x.chunk(2, dim=-1)[0] if gated else x
    if kind == "silu":
        a = F.silu(h)
    elif kind == "gelu":
        a = F.gelu(h, approximate="tanh")
    elif kind == "gelu_erf":
        a = F.gelu(h)
    elif kind == "relu2":
        a = torch.square(F.relu(h))
    else:
        raise ValueError(f"unknown activation {kind!r}")
    return a * x.chunk(2, dim=-1)[1] if gated else a


def add_reference(
    x: torch.Tensor,
    y: torch.Tensor | None,
    alpha: float = 1.0,
    beta: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha · x + beta · y (y None: alpha · x), same shapes; the residual add is alpha = 1."""
    r = x if alpha == 1.0 else x * alpha
    if y is not None:
        r = r + (y if beta == 1.0 else y * beta)
    return r if out is None else out.copy_(r)


def softcap_reference(x: torch.Tensor, cap: float) -> torch.Tensor:
    """x ← cap · tanh(x / cap) in place (Gemma 2's final logits); returns x."""
    return x.copy_(torch.tanh(x / cap) * cap)


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
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Per sequence: gather its keys from the pools, softmax(scale · q·kᵀ) · v in fp32; keys
    [L − window, L) with a window; no keys → zeros. `softcap` c: the scores s become c · tanh(s / c)
    before the softmax. `sinks` [H]: each head's logit joins the softmax as one more score without a
    value. (Row b is the prefill of one query at position L − 1: `attention_prefill_reference`.)"""
    B, H, _ = q.shape
    res = torch.zeros(B, H, v_pool.shape[2], dtype=torch.float32)
    for b in range(B):
        L = int(seq_lens[b])
        if L == 0:
            continue
        kw = {"window": window, "sinks": sinks, "softcap": softcap}
        row = attention_prefill_reference(q[b : b + 1], k_pool, v_pool, kv_indices[b], L - 1, scale, **kw)
        res[b] = row[0]
    return res if out is None else out.copy_(res)


def kv_write_reference(
    k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor
) -> None:
    """k_pool[slot_mapping[t]] = k[t], v_pool[slot_mapping[t]] = v[t] (cast to the pools' dtype)."""
    k_pool.index_copy_(0, slot_mapping, k.to(k_pool.dtype))
    v_pool.index_copy_(0, slot_mapping, v.to(v_pool.dtype))
