"""Plain-torch references of the MoE kernels (router top-k `moe_route_reference`, the chosen experts
`moe_experts_reference` over stacked weights, `stacked_slice`) and the MLA decode kernels (latent cache
write `mla_cache_write_reference`, absorbed decode attention `mla_decode_reference`, per-head projections
`linear_heads_reference` with `head_stride`), built on the linear / activation / RoPE references of
`reference.py`. `ops.moe_route` … `ops.linear_heads` run the C kernels and fall back to these; `ops`
re-exports them. (Moved out of `reference.py`.)

Shapes: T tokens, E experts, k chosen per token, D model width, N / I expert widths; B sequences, H heads,
L latent rank, R rotary dims, P table rows, S cache slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blazr.kernels.quant import BLOCK_BYTES, KMIX, ROW_GROUP, QuantizedWeight, dequantize
from blazr.kernels.reference import (
    _kernel_input,
    activation_reference,
    linear_reference,
    rope_neox_reference,
)


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
