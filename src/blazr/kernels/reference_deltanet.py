"""Torch references of the gated DeltaNet family's kernels: the DeltaNet decode step and prefill of one layer
(csrc/deltanet.c) and gated attention's per-head RMSNorm and sigmoid gate (csrc/gates.c). The DeltaNet ones
run from the in-projections' outputs to the gated-norm output that out_proj reads, with the conv and
delta-rule states advanced in place in their pools. `ops.deltanet_step` / `ops.deltanet_prefill` run the C
kernels and fall back to these (other dtypes and devices).

Per token: qkvz = [q | k | v | z] (the in_proj_qkvz output, q and k Hk·Dk wide, v and z Hv·Dv), ba = [b | a]
(Hv each):
- u = silu(causal depthwise conv of [q | k | v], K taps, the last K-1 inputs kept as the conv state);
- q, k = L2-normalised per head (eps 1e-6, as FLA), q · Dk^-½; value head h reads q / k head h // (Hv/Hk)
  (or h % Hk when `is_v_tiled`);
- g = −exp(A_log) · softplus(a + dt_bias), β = beta_scale · sigmoid(b);
- the gated delta rule (blazr.model.delta_rule) → o [Hv, Dv];
- y = (w · o / sqrt(mean(o²) + eps)) · silu(z), per value head (HF's Qwen3NextRMSNormGated).
Conv in the weights' dtype (as HF), everything after in float32; y is returned in qkvz's dtype.

Shapes: T tokens, B sequences, C = 2·Hk·Dk + Hv·Dv conv channels, K conv taps, S state slots; conv_state
[S, C, K-1], state [S, Hv, Dk, Dv] (float32).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.reference_conv import rows_in_order
from blazr.model.delta_rule import delta_rule_chunked, delta_rule_step

L2_EPS = 1e-6


def _heads(
    u: torch.Tensor, num_k_heads: int, Dk: int, Hv: int, Dv: int, is_v_tiled: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-conv rows u [n, C] → q, k [n, Hv, Dk] (normed, per value head) and v [n, Hv, Dv], float32."""
    n, Kd = u.shape[0], num_k_heads * Dk
    q, k, v = u.float().split([Kd, Kd, Hv * Dv], dim=-1)
    q = q.reshape(n, num_k_heads, Dk)
    k = k.reshape(n, num_k_heads, Dk)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * Dk**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    r = Hv // num_k_heads
    if is_v_tiled:  # value head h reads head h % Hk
        q, k = q.repeat(1, r, 1), k.repeat(1, r, 1)
    else:  # value head h reads head h // r
        q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
    return q, k, v.reshape(n, Hv, Dv)


def _gates(
    ba: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, beta_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """ba [n, 2·Hv] → g (log-decay), beta [n, Hv], float32."""
    b, a = ba.float().chunk(2, dim=-1)
    g = -torch.exp(A_log.float()) * F.softplus(a + dt_bias.float())
    return g, torch.sigmoid(b) * beta_scale


def _gated_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """o [n, Hv, Dv] float32, z [n, Hv·Dv] → [n, Hv·Dv] float32."""
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    o = weight.float() * o
    return o.flatten(1) * F.silu(z.float())


def conv_silu(
    cols: torch.Tensor, prior: torch.Tensor | None, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cols [C, n] new inputs, prior [C, K-1] (None: zeros) → silu(conv) [n, C] and the whole window
    [C, K-1 + n] (its last K-1 columns are the next conv state)."""
    C, K = weight.shape
    window = F.pad(cols, (K - 1, 0)) if prior is None else torch.cat([prior.to(cols.dtype), cols], dim=-1)
    w = weight.reshape(C, 1, K)
    u = F.silu(F.conv1d(window[None].to(w.dtype), w, groups=C))[0].t()
    return u, window


def deltanet_step_reference(
    qkvz: torch.Tensor,
    ba: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    num_k_heads: int,
    is_v_tiled: bool,
    beta_scale: float,
    eps: float,
) -> torch.Tensor:
    """One decode token for each of B sequences: qkvz [B, C + Hv·Dv], ba [B, 2·Hv], slots [B] (rows that share
    a slot run in row order: a sequence's consecutive tokens); conv_state / state advanced in place at the
    slots. Returns y [B, Hv·Dv] in qkvz's dtype."""
    rest = (
        conv_weight,
        conv_state,
        dt_bias,
        A_log,
        norm_weight,
        state,
        num_k_heads,
        is_v_tiled,
        beta_scale,
        eps,
    )
    if (y := rows_in_order(deltanet_step_reference, (qkvz, ba), slots, rest)) is not None:
        return y
    _, Hv, Dk, Dv = state.shape
    C = conv_weight.shape[0]
    window = torch.cat([conv_state[slots].to(qkvz.dtype), qkvz[:, :C, None]], dim=-1)  # [B, C, K]
    u = F.silu((window.to(conv_weight.dtype) * conv_weight).sum(-1, dtype=torch.float32))  # [B, C]
    conv_state[slots] = window[:, :, 1:].to(conv_state.dtype)
    q, k, v = _heads(u, num_k_heads, Dk, Hv, Dv, is_v_tiled)  # [B, Hv, D]
    g, beta = _gates(ba, dt_bias, A_log, beta_scale)
    o, S = delta_rule_step(q, k, v, g, beta, state.index_select(0, slots))  # every row's own slot
    state.index_copy_(0, slots, S)
    return _gated_norm(o, qkvz[:, C:], norm_weight, eps).to(qkvz.dtype)


def deltanet_prefill_reference(
    qkvz: torch.Tensor,
    ba: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    saves: Sequence[tuple[int, int, int]],
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    num_k_heads: int,
    is_v_tiled: bool,
    beta_scale: float,
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """The prefill of one layer for B sequences laid out one after another (query_lens[b] rows each of qkvz
    [T, C + Hv·Dv] and ba [T, 2·Hv]): from zero states where fresh[b], else from slot slots[b]'s, leaving
    each sequence's final conv / delta-rule state at its slot. `saves` (b, k, dst): the states after
    sequence b's first k tokens (0 < k < query_lens[b]) are also copied to slot dst — the chunks are cut
    there. Returns y [T, Hv·Dv] in qkvz's dtype; the delta rule in its chunked form (`delta_rule_chunked`)."""
    _, Hv, Dk, Dv = state.shape
    C, K = conv_weight.shape
    y = qkvz.new_empty(qkvz.shape[0], Hv * Dv, dtype=torch.float32)
    g, beta = _gates(ba, dt_bias, A_log, beta_scale)
    start = 0
    for b, n in enumerate(query_lens):
        slot = slots[b : b + 1]  # a 1-row index: no host read of the slot
        cuts = sorted({k for sb, k, _ in saves if sb == b} | {n})
        conv0 = None if fresh[b] else conv_state[slot][0]
        S = None if fresh[b] else state[slot][0]
        done = 0
        for cut in cuts:
            rows = slice(start + done, start + cut)
            u, window = conv_silu(qkvz[rows, :C].t(), conv0, conv_weight)
            q, k, v = _heads(u, num_k_heads, Dk, Hv, Dv, is_v_tiled)
            o, S = delta_rule_chunked(q, k, v, g[rows], beta[rows], chunk_size, S)
            y[rows] = _gated_norm(o, qkvz[rows, C:], norm_weight, eps)
            conv0 = window[:, window.shape[1] - (K - 1) :]
            for dst in (d for sb, k, d in saves if sb == b and k == cut):
                conv_state[dst] = conv0.to(conv_state.dtype)
                state[dst] = S
            done = cut
        conv_state[slot] = conv0[None].to(conv_state.dtype)
        state[slot] = S[None]
        start += n
    return y.to(qkvz.dtype)


def head_rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm of each [D] group of x [T, H, D] (a strided view: q or k heads of a fused projection's output):
    weight · (x / sqrt(mean(x²) + eps)), statistics in float32, into x in place or into `out` [T, H, D]
    (x then unchanged). Returns what it wrote."""
    xf = x.float()
    y = (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
    return (x if out is None else out).copy_(y)


def copy_rows_reference(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [M, N] ← x [M, N] (either's rows may be strided). Returns out."""
    return out.copy_(x)


def mul_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x [M, N] ← x · y, y [M, N] or [M, 1] (one per row), in place. Returns x."""
    x.mul_(y)
    return x


def sigmoid_mul_reference(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x [M, N] ← x · sigmoid(gate), gate [M, N] or [M, 1] (one per row), in place. Returns x."""
    x.mul_(torch.sigmoid(gate.float()).to(x.dtype))
    return x
