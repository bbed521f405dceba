"""Plain-torch references of the Mamba1 kernels (csrc/mamba1.c): x_proj's output split into dt and [B | C]
(with Falcon-Mamba's / Jamba's RMS norms), and the selective scan — its decode step and its prefill, the
SSM state advanced in place in its pool. The readable definitions the C kernels are tested against, and
what runs on other dtypes / devices (same signatures as the dispatchers in ops.py).

Shapes: T rows, B sequences, Di channels, N state size, R dt rank, S state slots; the SSM pool [S, Di, N].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.reference_conv import rows_in_order


def _rms(v: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    vf = v.float()
    vf = vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + eps)
    return vf.to(v.dtype) if w is None else w * vf.to(v.dtype)


def mamba1_dt_bc_reference(
    dbc: torch.Tensor,
    dt_rank: int,
    state_size: int,
    w_dt: torch.Tensor | None,
    w_b: torch.Tensor | None,
    w_c: torch.Tensor | None,
    is_normed: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x_proj's output dbc [T, R + 2N] = [dt | B | C] → (dt [T, R], [B | C] [T, 2N]), each part RMS-normed
    over its own features when `is_normed` (weights w_* or None: weightless), else as is."""
    dt, B, C = dbc.split([dt_rank, state_size, state_size], dim=-1)
    if is_normed:
        dt, B, C = _rms(dt, w_dt, eps), _rms(B, w_b, eps), _rms(C, w_c, eps)
    return dt.contiguous(), torch.cat([B, C], dim=-1)


def skip_and_gate(
    y: torch.Tensor, x: torch.Tensor, D: torch.Tensor, z: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The scan's output y [T, Di] with the D skip and the SiLU gate: (y + D·x)·silu(z), in float32, then
    `dtype`."""
    return ((y + D.float() * x) * F.silu(z.float())).to(dtype)


def _step(
    st: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, bc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """st [n, Di, N], x / dt [n, Di] float32, bc [n, 2N] → (Σ_n st'·C [n, Di], st')."""
    N = A.shape[-1]
    B, C = bc[:, :N], bc[:, N:]
    st = torch.exp(dt[..., None] * A) * st + (dt * x)[..., None] * B[:, None, :]
    return (st * C[:, None, :]).sum(-1), st


def mamba1_scan_step_reference(
    xc: torch.Tensor,
    dt_raw: torch.Tensor,
    bc: torch.Tensor,
    z: torch.Tensor,
    slots: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    ssm: torch.Tensor,
) -> torch.Tensor:
    """One new row for each of B sequences: dt = softplus(dt_raw); state ← exp(dt·A)·state + (dt·x)·B at slots
    [B] of ssm [S, Di, N]; y = (state·C + D·x)·silu(z). xc, dt_raw, z [B, Di] (z may be a strided view);
    bc [B, 2N]; A = −exp(A_log) [Di, N]; D [Di]. In float32; returns y [B, Di] in xc's dtype. Rows that share
    a slot run in row order (a sequence's consecutive tokens)."""
    if (y := rows_in_order(mamba1_scan_step_reference, (xc, dt_raw, bc, z), slots, (A, D, ssm))) is not None:
        return y
    x, dt = xc.float(), F.softplus(dt_raw.float())
    y, st = _step(ssm.index_select(0, slots).float(), x, dt, A.float(), bc.float())
    ssm.index_copy_(0, slots, st.to(ssm.dtype))
    return skip_and_gate(y, x, D, z, xc.dtype)


def mamba1_scan_prefill_reference(
    xc: torch.Tensor,
    dt_raw: torch.Tensor,
    bc: torch.Tensor,
    z: torch.Tensor,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    A: torch.Tensor,
    D: torch.Tensor,
    ssm: torch.Tensor,
) -> torch.Tensor:
    """B sequences laid out one after another (query_lens[b] rows each): the recurrence of the decode step
    row by row (transformers' sequential scan), sequence b starting from a zero state when fresh[b] (else from
    slot slots[b]'s) and leaving its final state there. Returns y [T, Di]."""
    x, dt = xc.float(), F.softplus(dt_raw.float())
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for b, n in enumerate(query_lens):
        slot = slots[b : b + 1]
        st = torch.zeros_like(ssm[slot], dtype=torch.float32) if fresh[b] else ssm[slot].float()
        for t in range(start, start + n):
            y[t : t + 1], st = _step(st, x[t : t + 1], dt[t : t + 1], A.float(), bc[t : t + 1].float())
        ssm[slot] = st.to(ssm.dtype)
        start += n
    return skip_and_gate(y, x, D, z, xc.dtype)
