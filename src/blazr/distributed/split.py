"""How a tensor is cut across tensor-parallel ranks: the pieces each mixer kind's `slice` and the
feed-forward's in distributed/shard.py are made of, and the divisibility checks behind each split.

A split dimension gives rank r its r-th contiguous block; a fused weight's segments (q | k | v, Mamba2's
z | x | B | C | dt) are split one by one, so each rank holds its block of every segment, in order. A
row-parallel bias is held by rank 0 only (the others zeros), so the all-reduced sum counts it once.
"""

from __future__ import annotations

import torch

from blazr.errors import UnsupportedError


def check_divisible(n: int, world: int, what: str) -> None:
    if n % world:
        raise UnsupportedError(f"tensor parallel {world}: {what} is {n}, not divisible by {world}")


def groups_split(n_groups: int, world: int) -> bool:
    """Mamba2's B / C groups split across ranks (True), or replicated (one group)."""
    if n_groups % world == 0:
        return True
    if n_groups == 1:
        return False
    raise UnsupportedError(f"tensor parallel {world}: Mamba2 has {n_groups} groups, not divisible by {world}")


def split_block(t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s contiguous block of `dim`."""
    n = t.shape[dim] // world
    return t.narrow(dim, rank * n, n)


def split_segments(
    t: torch.Tensor, sizes: list[int], split: list[bool], rank: int, world: int
) -> torch.Tensor:
    """Dim 0 cut into consecutive segments of `sizes`; each segment split (its rank block) or kept whole."""
    parts, start = [], 0
    for size, is_split in zip(sizes, split, strict=True):
        seg = t.narrow(0, start, size)
        parts.append(split_block(seg, 0, rank, world) if is_split else seg)
        start += size
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def rank0_only(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A row-parallel bias: the whole on rank 0, zeros elsewhere."""
    return t if rank == 0 else torch.zeros_like(t)


def slice_mlp(leaf: str, t: torch.Tensor, width: int, rank: int, world: int) -> torch.Tensor | None:
    """A gated MLP's tensor `leaf` (relative to the MLP) of intermediate `width`, split column- then
    row-parallel: gate_up's gate rows and up rows (or up's rows) by the width, down_proj's columns, its bias
    on rank 0; None: not an MLP tensor that splits."""
    if leaf.startswith("gate_up_proj."):
        return split_segments(t, [width] * 2, [True, True], rank, world)
    if leaf.startswith("up_proj."):
        return split_block(t, 0, rank, world)
    if leaf == "down_proj.weight":
        return split_block(t, 1, rank, world)
    if leaf == "down_proj.bias":
        return rank0_only(t, rank)
    return None
