"""Torch references of Kimi Delta Attention's kernels (Kimi-Linear): the decode step and the prefill of one
layer, from the projections' outputs to the gated-norm output that o_proj reads, with the conv and
delta-rule states advanced in place in their pools. `ops.kda_step` / `ops.kda_prefill` run the C kernels
(csrc/kda.c) and fall back to these (other dtypes and devices).

Per token, from qkv = [q | k | v] (the q / k / v projections' outputs, W = H·D each), f [W] (f_b(f_a(x)),
the decay's input), b [H] (b_proj(x)) and gate [W] (g_b(g_a(x))):
- u = silu(causal depthwise conv of qkv, K taps, the last K-1 inputs kept as the conv state);
- q, k = L2-normalised per head (eps 1e-6, as FLA), q · D^-½;
- g = −exp(A_log[h]) · softplus(f + dt_bias) per head and key channel (the channel-wise decay);
  β = sigmoid(b);
- the delta rule with channel-wise decay (blazr.model.delta_rule) → o [H, D];
- y = (w · o / sqrt(mean(o²) + eps)) · sigmoid(gate), per head (HF's KimiLinearRMSNormGated).
Conv in the weights' dtype (as HF), everything after in float32; y is returned in qkv's dtype.

Shapes: T tokens, B sequences, H heads of D, W = H·D, C = 3·W conv channels, K conv taps, S state slots;
conv_state [S, C, K-1], state [S, H, D, D] (float32).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.reference_conv import rows_in_order
from blazr.kernels.reference_deltanet import L2_EPS, conv_silu
from blazr.model.delta_rule import delta_rule_chunked, delta_rule_step


def _heads(u: torch.Tensor, H: int, D: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-conv rows u [n, 3·H·D] → q, k (normed; q · D^-½), v [n, H, D], float32."""
    q, k, v = u.float().unflatten(1, (3, H, D)).unbind(1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * D**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    return q, k, v


def _gates(
    f: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, D: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """f [n, H·D], b [n, H] → g (channel-wise log-decay) [n, H, D], beta [n, H], float32."""
    x = (f.float() + dt_bias.float()).unflatten(1, (-1, D))  # [n, H, D]
    g = -torch.exp(A_log.float())[:, None] * F.softplus(x)
    return g, torch.sigmoid(b.float())


def _gated_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """o [n, H, D] float32, gate [n, H·D] → [n, H·D] float32."""
    o = weight.float() * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps))
    return o.flatten(1) * torch.sigmoid(gate.float())


def kda_step_reference(
    qkv: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    slots: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """One decode token for each of B sequences: qkv [B, 3·W], f, gate [B, W], b [B, H], slots [B] (rows that
    share a slot run in row order: a sequence's consecutive tokens); conv_state / state advanced in place at
    the slots. Returns y [B, W] in qkv's dtype."""
    rest = (conv_weight, conv_state, dt_bias, A_log, norm_weight, state, eps)
    if (y := rows_in_order(kda_step_reference, (qkv, f, b, gate), slots, rest)) is not None:
        return y
    _, H, D, _ = state.shape
    window = torch.cat([conv_state[slots].to(qkv.dtype), qkv[:, :, None]], dim=-1)  # [B, C, K]
    u = F.silu((window.to(conv_weight.dtype) * conv_weight).sum(-1, dtype=torch.float32))  # [B, C]
    conv_state[slots] = window[:, :, 1:].to(conv_state.dtype)
    q, k, v = _heads(u, H, D)
    g, beta = _gates(f, b, dt_bias, A_log, D)
    o, S = delta_rule_step(q, k, v, g, beta, state.index_select(0, slots))  # every row's own slot
    state.index_copy_(0, slots, S)
    return _gated_norm(o, gate, norm_weight, eps).to(qkv.dtype)


def kda_prefill_reference(
    qkv: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
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
    eps: float,
    chunk_size: int,
) -> torch.Tensor:
    """The prefill of one layer for B sequences laid out one after another (query_lens[b] rows each of qkv
    [T, 3·W], f, gate [T, W], b [T, H]): from zero states where fresh[b], else from slot slots[b]'s, leaving
    each sequence's final conv / delta-rule state at its slot. `saves` (b, k, dst): the states after
    sequence b's first k tokens (0 < k < query_lens[b]) are also copied to slot dst — the chunks are cut
    there. Returns y [T, W] in qkv's dtype; the delta rule in its chunked form (`delta_rule_chunked`)."""
    _, H, D, _ = state.shape
    K = conv_weight.shape[1]
    y = qkv.new_empty(qkv.shape[0], H * D, dtype=torch.float32)
    g, beta = _gates(f, b, dt_bias, A_log, D)
    start = 0
    for i, n in enumerate(query_lens):
        slot = slots[i : i + 1]  # a 1-row index: no host read of the slot
        cuts = sorted({k for sb, k, _ in saves if sb == i} | {n})
        conv0 = None if fresh[i] else conv_state[slot][0]
        S = None if fresh[i] else state[slot][0]
        done = 0
        for cut in cuts:
            rows = slice(start + done, start + cut)
            u, window = conv_silu(qkv[rows].t(), conv0, conv_weight)
            q, k, v = _heads(u, H, D)
            o, S = delta_rule_chunked(q, k, v, g[rows], beta[rows], chunk_size, S)
            y[rows] = _gated_norm(o, gate[rows], norm_weight, eps)
            conv0 = window[:, window.shape[1] - (K - 1) :]
            for dst in (d for sb, k, d in saves if sb == i and k == cut):
                conv_state[dst] = conv0.to(conv_state.dtype)
                state[dst] = S
            done = cut
        conv_state[slot] = conv0[None].to(conv_state.dtype)
        state[slot] = S[None]
        start += n
    return y.to(qkv.dtype)
