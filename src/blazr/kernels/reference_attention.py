"""Plain-torch reference of the prefill attention kernel (csrc/attention_prefill.c): one sequence's prompt
chunk, causal over its cached and new keys read from the paged pools. Shapes as in `ops.py`."""

from __future__ import annotations

import torch

_SCORES = 1 << 24  # score elements per block of query rows (64 MB)


def attention_prefill_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    ctx: int,
    scale: float,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [n, H, D] at positions ctx .. ctx + n − 1 against the keys / values at slots kv_slots[: ctx + n] of
    k_pool [S, Hkv, D] / v_pool [S, Hkv, Dv] (widened to fp32): row i sees keys j ≤ ctx + i, with a window
    also j > ctx + i − window; scores scale · q·k, soft-capped c · tanh(s / c) with `softcap` c; `sinks` [H]:
    each head's logit joins the softmax's denominator without a value. Returns [n, H, Dv] fp32."""
    n, H, _ = q.shape
    G = H // k_pool.shape[1]
    idx = kv_slots[: ctx + n]
    k = k_pool[idx].float().repeat_interleave(G, dim=1)  # [L, H, D]
    v = v_pool[idx].float().repeat_interleave(G, dim=1)
    res = torch.empty(n, H, v.shape[-1])
    step = max(1, _SCORES // (H * (ctx + n)))  # query rows per [H, rows, L] score block
    for i0 in range(0, n, step):
        qi = q[i0 : i0 + step].float()
        s = torch.einsum("ihd,jhd->hij", qi, k) * scale  # [H, rows, L]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        rows = torch.arange(i0, i0 + len(qi))[:, None] + ctx
        cols = torch.arange(ctx + n)[None, :]
        seen = cols <= rows
        if window:
            seen &= cols > rows - window
        s = s.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            sink = sinks.float().view(H, 1, 1).expand(H, len(qi), 1)
            p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            p = s.softmax(-1)
        res[i0 : i0 + len(qi)] = torch.einsum("hij,jhd->ihd", p, v)
    return res if out is None else out.copy_(res)
