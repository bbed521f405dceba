"""The Mamba1 selective scan's prefill in log-depth form: what runs where the C kernel does not (a GPU, other
dtypes), in place of the reference's loop of one step per token — on a GPU, ~8 launches per token per layer
(a 512-token prompt through a 24-layer Mamba: ~100k launches, seconds).

The recurrence h_t = a_t · h_{t-1} + b_t (a_t = exp(dt_t · A), b_t = (dt_t · x_t) · B_t) is a scan over
the pairs (a_t, b_t) under (a, b) ∘ (a', b') = (a · a', a · b' + b) — Hillis–Steele: log2(n) passes, each
over all rows at once. Every a_t lies in (0, 1], so the products only shrink (no overflow, unlike a closed
form through exp(cumsum)). Rows go through in chunks of `CHUNK`, the state carried between them, which
bounds the [n, Di, N] temporaries. The same function as `mamba1_scan_prefill_reference` to float32
rounding (a different association order); tied to it in tests/test_kernels_mamba1.py.

Shapes: T rows, B sequences, Di channels, N state size, S state slots; the SSM pool [S, Di, N].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from blazr.kernels.reference_mamba1 import skip_and_gate

CHUNK = 256  # rows per scan pass


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """h_t = a_t · h_{t-1} + b_t for t over dim 0, from h0: a, b [n, ...]; h0 [...]. Returns h [n, ...]."""
    n, off = a.shape[0], 1
    while off < n:  # after the pass, row t composes rows (t - 2·off, t]
        b = torch.cat([b[:off], a[off:] * b[:-off] + b[off:]])
        a = torch.cat([a[:off], a[off:] * a[:-off]])
        off *= 2
    return a * h0 + b


def mamba1_scan_prefill_parallel(
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
    """`mamba1_scan_prefill_reference`'s signature and function: B sequences laid out one after another
    (query_lens[b] rows each of xc, dt_raw, z [T, Di] and bc [T, 2N]), sequence b from a zero state when
    fresh[b] (else slot slots[b]'s), its final state left there. Returns y [T, Di] in xc's dtype."""
    x, dt = xc.float(), F.softplus(dt_raw.float())
    Af = A.float()
    N = Af.shape[-1]
    Bm, Cm = bc.float().split(N, dim=-1)  # [T, N] each
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for b, n in enumerate(query_lens):
        slot = slots[b : b + 1]
        h = x.new_zeros(x.shape[1], N) if fresh[b] else ssm[slot][0].float()  # [Di, N]
        for c0 in range(start, start + n, CHUNK):
            rows = slice(c0, min(start + n, c0 + CHUNK))
            a = torch.exp(dt[rows, :, None] * Af)  # [n, Di, N]
            hs = linear_scan(a, (dt[rows] * x[rows])[:, :, None] * Bm[rows, None, :], h)
            y[rows] = (hs * Cm[rows, None, :]).sum(-1)
            h = hs[-1]
        ssm[slot] = h[None].to(ssm.dtype)
        start += n
    return skip_and_gate(y, x, D, z, xc.dtype)
