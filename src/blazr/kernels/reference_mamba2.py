"""Plain-torch references of the Mamba2 kernels (csrc/mamba2.c): the SSD state update of one token
(`ssd_step_reference`), the decode step of one layer (`mamba2_step_reference`: conv step + SiLU, dt, the
SSD update and the D skip, states advanced in place in their pools) and the prefill of one layer
(`mamba2_prefill_reference`: the chunked SSD scan of `blazr.model.ssd`). `ops.mamba2_step` /
`ops.mamba2_prefill` run the C kernels and fall back to these; `ops` re-exports them. (Moved out of
`reference.py`.)

Shapes: B sequences, T tokens, H heads of P, G groups, N state size, Cd = H·P + 2·G·N conv channels, K conv
taps, S state slots; conv_state [S, Cd, K-1], ssm_state [S, H, P, N].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.reference_conv import rows_in_order
from blazr.model.ssd import ssd_chunked


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
