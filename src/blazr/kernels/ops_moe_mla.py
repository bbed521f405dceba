"""The kernel ops of MoE (`moe_route`: the router's top-k; `moe_experts`: the chosen experts over stacked
weights) and of MLA decode (`mla_cache_write`: the latent cache rows; `mla_decode`: absorbed decode
attention; `linear_heads`: per-head projections). Each runs its C kernel through `dispatch._dispatch` when
the library takes the inputs, else its torch reference (`reference_moe_mla.py`) with the same signature.
Moved out of `ops.py`, which re-exports every op here with its reference — call them as
`ops.moe_experts(...)`. Shapes as in `ops.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.dispatch import _dispatch
from blazr.kernels.quant import QuantizedWeight
from blazr.kernels.reference_moe_mla import (
    linear_heads_reference,
    mla_cache_write_reference,
    mla_decode_reference,
    moe_experts_reference,
    moe_route_reference,
)


def moe_route(
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
    """The MoE router's choice: logits [T, E] (fp32) → (weights [T, k] fp32, ids [T, k] int64); see
    moe_route_reference for the rule (softmax / sigmoid, bias for selection, group-limited top-k)."""
    return _dispatch(
        "moe_route", moe_route_reference, logits, bias, sigmoid, num_groups, topk_groups, group_top2, top_k,
        renorm, scale,
    )  # fmt: skip


def moe_experts(
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
    """Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) → [T, D] fp32, running only the chosen experts' rows of
    the stacked weights w_up [E·N, D] (N = 2I gated, [gate; up], else I) and w_down [E·D, I] in any kernel
    weight format; tokens routed to one expert share one read of its weights. Optional float32 biases
    up_bias [E, N], down_bias [E, D]; `swiglu_alpha` / `swiglu_limit`: the swiglu_oai activation's."""
    return _dispatch(
        "moe_experts", moe_experts_reference, x, ids, weights, w_up, w_down, num_experts, activation, gated,
        up_bias=up_bias, down_bias=down_bias, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
    )  # fmt: skip


def mla_cache_write(
    kv: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    pool: torch.Tensor,
) -> None:
    """MLA's cache rows of the new tokens: kv [T, L + R] (the kv_a projection) → pool[slots] = [RMSNorm(c_kv)
    | rotated k_rope] (pool [S, L + R], fp32 or 16-bit)."""
    return _dispatch(
        "mla_cache_write", mla_cache_write_reference, kv, norm_weight, eps, positions, cos, sin, slots, pool
    )


def mla_decode(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    pool: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA decode attention over the latent pool, one query per sequence: q_lat [B, H, L] (q_nope ·
    W_UK, `linear_heads`) and rotated q_rope [B, H, R] (strided views allowed) → the latent-space output
    [B, H, L] fp32 (W_UV applied after, `linear_heads`); see mla_decode_reference."""
    return _dispatch("mla_decode", mla_decode_reference, q_lat, q_rope, pool, kv_indices, seq_lens, scale)


def linear_heads(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """Per-head projections: x [B, H, K] (a strided view allowed) and w stacking H weights [N, K] in any
    kernel format → [B, H, N], out[b, h] = x[b, h] · W_hᵀ; each head's weight read once for the batch."""
    return _dispatch("linear_heads", linear_heads_reference, x, w)
