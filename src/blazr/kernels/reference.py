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

from blazr.kernels.kquant import quantize_q8_k
from blazr.kernels.quant import (
    BLOCK_BYTES,
    KMIX,
    QK,
    QK_K,
    ROW_GROUP,
    QuantizedWeight,
    block_fields,
    dequantize,
)
from blazr.kernels.reference_conv import rows_in_order
from blazr.kernels.row_table import RowTable
from blazr.model.ssd import ssd_chunked


def linear_out_features(qw: QuantizedWeight, swiglu: bool) -> int:
    """Output width of a linear layer: N, or N/2 for the SwiGLU form (N must then be even)."""
    if swiglu and qw.out_features % 2:
        raise ValueError(f"SwiGLU linear: weight has {qw.out_features} rows, expected an even [gate; up]")
    return qw.out_features // 2 if swiglu else qw.out_features


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
) -> torch.Tensor:
    """fp32 matmul with the dequantized weight, then the epilogue (bias, SwiGLU or residual). (`prefill`
    chooses among the kernel's paths; the reference has one.)

    A kmix weight with 32-block segments: each segment's rows by this rule. K-quant weights (q4_k / q5_k /
    q6_k, a kmix of them) see x rounded as their kernel rounds it (`quantize_q8_k`: 8 bits
    per 256, an f32 scale): x̂ = d·q. The kernel then differs from this reference only by fp32 rounding —
    of the dequantized weight and x̂ here (≤ 2u·|w|, u·|x̂| per element), of its per-super-block scales and
    sums there — within γ_{K/256·2+8}·Σ|x̂|·(|d·sc·q| + |dmin·m|) + γ_K·Σ|x̂·w|; against the unrounded x
    add Σ_blocks |d|·(½ + 2⁻¹⁴)·Σ_block |w|."""
    linear_out_features(qw, swiglu)
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
    value."""
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
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale  # [H, n]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if sinks is not None:
            p = torch.cat([s, sinks.float()[:, None]], dim=1).softmax(-1)[:, :-1]
        else:
            p = s.softmax(-1)
        res[b] = torch.einsum("hn,nhd->hd", p, v)
    return res if out is None else out.copy_(res)


def kv_write_reference(
    k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor
) -> None:
    """k_pool[slot_mapping[t]] = k[t], v_pool[slot_mapping[t]] = v[t] (cast to the pools' dtype)."""
    k_pool.index_copy_(0, slot_mapping, k.to(k_pool.dtype))
    v_pool.index_copy_(0, slot_mapping, v.to(v_pool.dtype))


def ssd_step_reference(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SSD token for a batch of sequences: state [B, H, P, N]; x [B, H, P]; dt [B, H]; A [H]; B, C
    [B, G, N] (head h reads group h // (H / G)). Returns y [B, H, P] and the new state [B, H, P, N]
    (float32; the input state is not modified): h' = exp(dt·A)·h + dt·x ⊗ B, y = h'·C."""
    Bsz, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    f32 = torch.float32
    dt = dt.to(f32)
    decay = torch.exp(dt * A.to(f32))[:, :, None, None]  # [B, H, 1, 1]
    Bh = B.to(f32)[:, :, None, :].expand(Bsz, G, H // G, N).reshape(Bsz, H, 1, N)  # group → its heads
    Ch = C.to(f32)[:, :, None, :].expand(Bsz, G, H // G, N).reshape(Bsz * H, N, 1)
    new_state = decay * state.to(f32) + (x.to(f32) * dt[..., None])[..., None] * Bh  # [B, H, P, N]
    y = torch.bmm(new_state.view(Bsz * H, P, N), Ch)  # [B·H, P, 1]
    return y.view(Bsz, H, P), new_state


def mamba2_step_reference(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    D: torch.Tensor,
    ssm_state: torch.Tensor,
    n_groups: int,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    """One Mamba2 decode token for B sequences (see csrc/mamba2.c): xbc [B, Cd] pre-conv [x | B | C];
    dt_raw [B, H]; slots [B]; conv_weight [Cd, K] (+ conv_bias [Cd]); conv_state [S, Cd, K-1] and ssm_state
    [S, H, P, N] advanced in place at `slots`; dt_bias, A_log (A = −exp(A_log)), D [H]. Returns y [B, H, P]
    float32 = SSM output + D·x. The conv's K taps accumulate in float32, then round to the weights' dtype for
    SiLU (as HF's decode); dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max) and the scan in float32.
    Rows that share a slot run in row order (a sequence's consecutive tokens: each one's state follows)."""
    Bsz, H = dt_raw.shape
    rest = (conv_weight, conv_bias, conv_state, dt_bias, A_log, D, ssm_state, n_groups, dt_min, dt_max)
    if (y := rows_in_order(mamba2_step_reference, (xbc, dt_raw), slots, rest)) is not None:
        return y
    P, N = ssm_state.shape[2:]
    GN = n_groups * N
    window = torch.cat([conv_state.index_select(0, slots), xbc[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state.index_copy_(0, slots, window[:, :, 1:])  # drop the oldest column
    conv = (window.float() * conv_weight.float()).sum(-1)  # [B, Cd]
    if conv_bias is not None:
        conv = conv + conv_bias.float()
    u = F.silu(conv.to(conv_weight.dtype)).float()
    x, Bm, Cm = u.split([H * P, GN, GN], dim=-1)
    x = x.reshape(Bsz, H, P)
    dt = F.softplus(dt_raw.float() + dt_bias.float()).clamp(dt_min, dt_max)
    y, new = ssd_step_reference(
        ssm_state.index_select(0, slots),
        x,
        dt,
        -torch.exp(A_log.float()),
        Bm.reshape(Bsz, n_groups, N),
        Cm.reshape(Bsz, n_groups, N),
    )
    ssm_state.index_copy_(0, slots, new.to(ssm_state.dtype))
    return y + x * D.float()[:, None]


def mamba2_prefill_reference(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    D: torch.Tensor,
    ssm_state: torch.Tensor,
    n_groups: int,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    """The prefill of one Mamba2 layer for B sequences (see csrc/mamba2.c): sequence b owns the next
    query_lens[b] rows of xbc [T, Cd] (pre-conv [x | B | C]) and dt_raw [T, H], and state slot slots[b] of
    conv_state [S, Cd, K-1] / ssm_state [S, H, P, N], starting from zeros when fresh[b] (else continuing
    from the slot's states) and leaving its final states there. Returns y [T, H, P] float32 = SSM output +
    D·x. Per sequence: the causal conv + SiLU in the weights' dtype (as HF), then the chunked SSD scan
    (`blazr.model.ssd.ssd_chunked`, float32) in chunks of 256."""
    T, H = dt_raw.shape
    P, N = ssm_state.shape[2:]
    K, GN = conv_weight.shape[-1], n_groups * N
    w = conv_weight.reshape(-1, 1, K)
    A = -torch.exp(A_log.float())
    dt = F.softplus(dt_raw.float() + dt_bias.float()).clamp(dt_min, dt_max)  # [T, H]
    y = torch.empty(T, H, P, dtype=torch.float32, device=xbc.device)
    start = 0
    for b, n in enumerate(query_lens):
        rows, slot = slice(start, start + n), slots[b : b + 1]
        start += n
        cols = xbc[rows].t()  # [Cd, n]
        if fresh[b]:
            window = F.pad(cols, (K - 1, 0))  # zero left context
        else:
            window = torch.cat([conv_state.index_select(0, slot)[0].to(cols.dtype), cols], dim=-1)
        u = F.silu(F.conv1d(window[None].to(w.dtype), w, conv_bias, groups=w.shape[0]))[0].t()  # [n, Cd]
        x, Bm, Cm = u.float().split([H * P, GN, GN], dim=-1)
        x = x.reshape(n, H, P)
        ssm0 = None if fresh[b] else ssm_state.index_select(0, slot).float()
        Bm, Cm = Bm.reshape(1, n, n_groups, N), Cm.reshape(1, n, n_groups, N)
        ys, ssm1 = ssd_chunked(x[None], dt[rows][None], A, Bm, Cm, 256, ssm0)
        y[rows] = ys[0] + x * D.float()[:, None]
        conv_state.index_copy_(0, slot, window[None, :, window.shape[1] - (K - 1) :].to(conv_state.dtype))
        ssm_state.index_copy_(0, slot, ssm1.to(ssm_state.dtype))
    return y


def stacked_slice(qw: QuantizedWeight, e: int, num: int) -> QuantizedWeight:
    """Expert e's rows of a stacked weight (`num` experts' [N, K] weights one after another, [num·N, K]),
    as a view. Every expert must start on a whole first dimension of `data` (block kinds: N a multiple of
    the row group)."""
    rows, per = qw.out_features // num, qw.data.shape[0] // num
    if qw.out_features % num or qw.data.shape[0] % num:
        raise ValueError(f"stacked weight [{qw.out_features}, {qw.in_features}] does not split into {num}")
    return QuantizedWeight(qw.kind, qw.data[e * per : (e + 1) * per], rows, qw.in_features)


def moe_route_reference(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    sigmoid: bool,
    num_groups: int,
    topk_groups: int,
    group_top2: bool,
    top_k: int,
    renorm: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] → (weights [T, k] fp32, ids [T, k] int64): scores = softmax or sigmoid; choice =
    scores (+ bias, selection only); group-limited when num_groups > 1 (keep the topk_groups groups with the
    best max, or top-two sum when group_top2, choose inside them); ids = top-k of choice; weights = the
    scores of ids, renormalised over the k when `renorm`, times `scale` (see model/moe.py)."""
    logits = logits.float()
    scores = logits.sigmoid() if sigmoid else logits.softmax(dim=-1)
    choice = scores + bias.float() if bias is not None else scores
    if num_groups > 1:
        grouped = choice.unflatten(-1, (num_groups, -1))  # [T, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1) if group_top2 else grouped.amax(dim=-1)
        keep = group_scores.topk(topk_groups, dim=-1).indices  # [T, topk_groups]
        is_kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = grouped.masked_fill(~is_kept[..., None], float("-inf")).flatten(1)
    ids = choice.topk(top_k, dim=-1).indices  # [T, k]
    weights = scores.gather(1, ids)
    if renorm:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if scale != 1.0:
        weights = weights * scale
    return weights, ids


def moe_experts_reference(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_up: QuantizedWeight,
    w_down: QuantizedWeight,
    num_experts: int,
    activation: str,
    gated: bool,
    *,
    up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    """Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) → [T, D] fp32, each expert MLP = act(x · W_upᵀ + b_up)
    (gated: act(gate) · up of the [gate; up] halves; swiglu_oai: GPT-OSS's clamped unit) · W_downᵀ + b_down
    with its rows of the stacked w_up [E·N, D] / w_down [E·D, I] (see stacked_slice) and of the optional
    biases up_bias [E, N] / down_bias [E, D]; only the chosen experts are dequantized."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in ids.unique().tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        h = linear_reference(x[t].float(), stacked_slice(w_up, e, num_experts))
        if up_bias is not None:
            h = h + up_bias[e].float()
        a = activation_reference(h, activation, gated, swiglu_alpha, swiglu_limit)
        y = linear_reference(a, stacked_slice(w_down, e, num_experts))
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, t, y * weights[t, j, None].float())
    return out


def mla_cache_write_reference(
    kv: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    pool: torch.Tensor,
) -> None:
    """MLA's new latent rows: kv [T, L + R] (the kv_a projection; rows may be strided) → pool[slots[t]] =
    [RMSNorm(c_kv) | rotated k_rope] in the pool's dtype (no norm weight: c_kv as is; NeoX half-split
    rotation by rows `positions` of cos / sin [P, R/2])."""
    R = 2 * cos.shape[1]
    c, k_rope = kv[:, :-R].float(), kv[:, -R:].float().clone()
    if norm_weight is not None:
        c = norm_weight * (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps))
    rope_neox_reference(k_rope.unsqueeze(1), positions, cos, sin, R)
    pool.index_copy_(0, slots, torch.cat((c, k_rope), dim=-1).to(pool.dtype))


def mla_decode_reference(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    pool: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA decode attention, one query per sequence: q_lat [B, H, L] (q_nope · W_UK) and q_rope
    [B, H, R] over the latent rows pool[kv_indices[b, :seq_lens[b]]] ([S, L + R]: c_kv | k_rope) → the
    latent-space output [B, H, L] fp32 (no keys → zeros): p = softmax(scale · (q_lat · c_kv + q_rope ·
    k_rope)); out = p · c_kv."""
    B, H, L = q_lat.shape
    out = torch.zeros(B, H, L, dtype=torch.float32)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        lat = pool[kv_indices[b, :n]].float()  # [n, L + R]
        s = (q_lat[b].float() @ lat[:, :L].T + q_rope[b].float() @ lat[:, L:].T) * scale  # [H, n]
        out[b] = s.softmax(-1) @ lat[:, :L]
    return out


def head_stride(qw: QuantizedWeight, heads: int) -> int:
    """Bytes from one head's part to the next of a weight that stacks `heads` equal [N / heads, K] parts
    (MLA's per-head W_UKᵀ / W_UV); ValueError when its rows do not split into whole heads (a packed block
    kind needs whole 16-row groups per head; a kmix weight's segments never split)."""
    n = qw.out_features // heads if heads > 0 else 0
    if heads <= 0 or qw.out_features % heads or qw.kind == KMIX or (qw.kind in BLOCK_BYTES and n % ROW_GROUP):
        raise ValueError(
            f"a {qw.kind} weight of {qw.out_features} rows does not split into {heads} heads"
            + (f" of whole {ROW_GROUP}-row groups" if qw.kind in BLOCK_BYTES else "")
        )
    return qw.nbytes // heads


def linear_heads_reference(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """Per-head projections: x [B, H, K] and w stacking H weights [N, K] ([H·N, K]) → out [B, H, N] with
    out[b, h] = x[b, h] · W_hᵀ (fp32 with the dequantized weight, x rounded as `linear_reference` does)."""
    H, K = x.shape[1:]
    head_stride(w, H)
    return torch.einsum("bhk,hnk->bhn", _kernel_input(x, w), dequantize(w).view(H, -1, K))
