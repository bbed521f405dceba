"""A recurrent mixer's prefill rows cut at the prefix cache's save points (`ForwardBatch.state_saves`): round
r runs every prefill sequence's r-th segment (one call of the mixer's prefill kernel over those segments),
then copies the states of the sequences whose save point it reached into their snapshot slots — the
mid-chunk snapshots of Snapshot.STATE_SLOT kinds (the short conv, Mamba1; Mamba2 keeps its own copy of
this walk in model/mamba2.py).

Shapes: Tp prefill rows (the batch's tokens after its Bd decode rows), B' prefill sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from blazr.state.batch import ForwardBatch


@dataclass(frozen=True)
class Segment:
    """One round: `rows` [n] the prefill rows it runs (indices into the Tp prefill rows), per sequence in it
    its length, state slot, whether it starts from zero, and the (slot → snapshot slot) copies after it."""

    rows: torch.Tensor
    lens: list[int]
    slots: torch.Tensor
    fresh: list[bool]
    saves: list[tuple[int, int]]


def segments(batch: ForwardBatch) -> list[Segment]:
    """The rounds of the batch's prefill rows, cut at its `state_saves` (one round when it has none)."""
    nd = batch.num_decodes
    qlens, slots = batch.query_lens[nd:], batch.state_slots[nd:]
    cuts: list[list[tuple[int, int | None]]] = [[(q, None)] for q in qlens]  # (segment end, save slot)
    for b, k, dst in batch.state_saves:
        cuts[b - nd].append((k, dst))
    cuts = [sorted(c, key=lambda e: e[0]) for c in cuts]
    starts = [sum(qlens[:i]) for i in range(len(qlens))]
    done = [0] * len(qlens)  # rows of each sequence run so far
    out = []
    for r in range(max((len(c) for c in cuts), default=0)):
        seqs = [i for i, c in enumerate(cuts) if r < len(c) and c[r][0] > done[i]]
        if not seqs:
            continue
        rows = torch.cat([torch.arange(starts[i] + done[i], starts[i] + cuts[i][r][0]) for i in seqs])
        out.append(
            Segment(
                rows=rows.to(slots.device),
                lens=[cuts[i][r][0] - done[i] for i in seqs],
                slots=slots[seqs],
                fresh=[done[i] == 0 and batch.context_lens[nd + i] == 0 for i in seqs],
                saves=[(int(slots[i]), d) for i in seqs if (d := cuts[i][r][1]) is not None],
            )
        )
        for i in seqs:
            done[i] = cuts[i][r][0]
    return out


def run_in_segments(
    batch: ForwardBatch,
    run: Callable[[Segment], torch.Tensor],
    out: torch.Tensor,
    states: Sequence[torch.Tensor],
) -> torch.Tensor:
    """out[seg.rows] = run(seg) for each round, then each save's rows of `states` (the pools [S, …] the run
    advanced) copied to its snapshot slot; returns out ([Tp, …])."""
    for seg in segments(batch):
        out[seg.rows] = run(seg)
        if seg.saves:
            src = torch.tensor([s for s, _ in seg.saves], device=out.device)
            dst = torch.tensor([d for _, d in seg.saves], device=out.device)
            for state in states:
                state[dst] = state[src]
    return out
