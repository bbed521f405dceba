"""Plain-torch references of the short-convolution kernel (csrc/causal_conv.c): the causal depthwise conv of
LFM2's gated short conv and of Mamba1 — its decode step and its prefill, the state advanced in place in its
pool. The readable definitions the C kernel is tested against, and what runs on other dtypes / devices (same
signatures as the dispatchers in ops.py).

Shapes: T rows, B sequences, C channels, K kernel width, S state slots; the conv state pool is [S, K−1, C]
(tap-major: the last K−1 inputs, oldest first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def _gated(x: torch.Tensor, gin: torch.Tensor | None) -> torch.Tensor:
    return x if gin is None else gin * x


def _output(v: torch.Tensor, gout: torch.Tensor | None, silu: bool) -> torch.Tensor:
    if silu:
        v = F.silu(v)
    return v if gout is None else gout * v


def rows_in_order(
    step: Callable[..., torch.Tensor],
    rows: tuple[torch.Tensor | None, ...],
    slots: torch.Tensor,
    rest: tuple,
) -> torch.Tensor | None:
    """A decode step's reference over rows that share a state slot (a sequence's consecutive tokens): `step`
    one row at a time, in row order — `rows` its per-row arguments before `slots` (None stays None), `rest`
    those after — the outputs joined. None when every row has a slot of its own (the batched form applies).

    Rows share slots only in the recorded CPU decode plan (engine/runner.py `_run_decode_plan`: a row
    sequence's drafts; recording needs the C library, so there these references run only in tests); the
    eager decode rows are one per sequence. So slots on an accelerator are taken as distinct, unread: a read
    would wait for the device on every recurrent layer of every step."""
    if slots.device.type != "cpu" or len(set(slots.tolist())) == len(slots):
        return None
    one = [
        step(*(None if t is None else t[i : i + 1] for t in rows), slots[i : i + 1], *rest)
        for i in range(len(slots))
    ]
    return torch.cat(one)


def causal_conv_step_reference(
    x: torch.Tensor,
    gin: torch.Tensor | None,
    gout: torch.Tensor | None,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
) -> torch.Tensor:
    """One new row for each of B sequences: u = gin·x (x alone when gin is None), v = bias + Σ_k weight[:, k]·
    (the K−1 inputs of state slot slots[b], then u)[k], y = gout·act(v) with act SiLU when `silu`. x, gin,
    gout [B, C]; weight [C, K]; state [S, K−1, C] shifted in place. The taps accumulate in float32, then round
    to the weights' dtype (as HF's decode step). Returns y [B, C]. Rows that share a slot run in row order
    (a sequence's consecutive tokens)."""
    rest = (weight, bias, state, silu)
    if (y := rows_in_order(causal_conv_step_reference, (x, gin, gout), slots, rest)) is not None:
        return y
    u = _gated(x, gin)
    window = torch.cat([state.index_select(0, slots), u[:, None, :].to(state.dtype)], dim=1)  # [B, K, C]
    state.index_copy_(0, slots, window[:, 1:])
    v = (window.float() * weight.float().t()[None]).sum(1)  # [B, C]
    if bias is not None:
        v = v + bias.float()
    return _output(v.to(weight.dtype), gout, silu).to(x.dtype)


def causal_conv_prefill_reference(
    x: torch.Tensor,
    gin: torch.Tensor | None,
    gout: torch.Tensor | None,
    query_lens: Sequence[int],
    slots: torch.Tensor,
    fresh: Sequence[bool],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
) -> torch.Tensor:
    """B sequences laid out one after another (query_lens[b] rows each), sequence b starting from a zero
    state when fresh[b] (else from slot slots[b]'s) and leaving its last K−1 inputs there; the conv by
    F.conv1d in the weights' dtype (as HF's prefill). Arguments as the decode step; returns y [T, C]."""
    K = weight.shape[-1]
    u = _gated(x, gin)
    y = torch.empty(u.shape, dtype=x.dtype, device=x.device)
    start = 0
    for b, n in enumerate(query_lens):
        rows, slot = slice(start, start + n), slots[b : b + 1]
        start += n
        cols = u[rows].t()  # [C, n]
        old = cols.new_zeros(cols.shape[0], K - 1) if fresh[b] else state[slot][0].t().to(cols.dtype)
        window = torch.cat([old, cols], dim=-1)  # [C, K−1+n]
        v = F.conv1d(window[None].to(weight.dtype), weight[:, None, :], bias, groups=weight.shape[0])[0].t()
        y[rows] = _output(v, None if gout is None else gout[rows], silu).to(x.dtype)
        state[slot] = window[:, window.shape[1] - (K - 1) :].t()[None].to(state.dtype)
    return y
