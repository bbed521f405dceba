"""A recurrent mixer's prefill rows cut at the prefix cache's save points (`ForwardBatch.state_saves`): round
r runs every prefill sequence's r-th segment (one call of the mixer's prefill kernel over those segments),
then copies the states of the sequences whose save point it reached into their snapshot slots — the
mid-chunk snapshots of Snapshot.STATE_SLOT kinds (Mamba2, the short conv, Mamba1; the delta-rule kernels
take the save points themselves).

A round's rows are moved as rows, never element by element: one sequence's segment (a lone prompt, the
common case) is a slice — a view, nothing copied in —, several are gathered by `index_select` and
scattered by `index_copy_` (torch's advanced indexing gathered ~12× slower: a 256-token bf16 prefill at
granite-4.0-h-350m's shape ran 135-140 → 141-147 tok/s with the prefix cache on, benchmarks/NOTES.md §72).
No host value is read from a device tensor.

Shapes: Tp prefill rows (the batch's tokens after its Bd decode rows), B' prefill sequences, S state slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from blazr.state.batch import ForwardBatch


@dataclass(frozen=True)
class Segment:
    """One round: its rows of the Tp prefill rows as [start, end) ranges (one per sequence in it, in order),
    per sequence its length, state slot, whether it starts from zero; after it, the states of `save_from`
    (slots [k]) are copied to `save_to` (snapshot slots [k])."""

    ranges: tuple[tuple[int, int], ...]
    rows: torch.Tensor | None  # the rows of several ranges as one index [n] (None: one range, a slice)
    lens: list[int]
    slots: torch.Tensor
    fresh: list[bool]
    save_from: torch.Tensor
    save_to: torch.Tensor

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The round's rows of t [Tp, …]: a view of one range, else the rows gathered (contiguous)."""
        if self.rows is None:
            a, b = self.ranges[0]
            return t[a:b]
        return torch.index_select(t, 0, self.rows)

    def put(self, out: torch.Tensor, rows: torch.Tensor) -> None:
        """out [Tp, …] at the round's rows ← rows [n, …]."""
        if self.rows is None:
            a, b = self.ranges[0]
            out[a:b].copy_(rows)
        else:
            out.index_copy_(0, self.rows, rows.to(out.dtype))


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
        saving = [i for i in seqs if cuts[i][r][1] is not None]
        ranges = tuple((starts[i] + done[i], starts[i] + cuts[i][r][0]) for i in seqs)
        rows = None  # one range: a slice
        if len(ranges) > 1:
            rows = torch.cat([torch.arange(a, b) for a, b in ranges]).to(slots.device)
        out.append(
            Segment(
                ranges=ranges,
                rows=rows,
                lens=[cuts[i][r][0] - done[i] for i in seqs],
                slots=slots[seqs],
                fresh=[done[i] == 0 and batch.context_lens[nd + i] == 0 for i in seqs],
                save_from=slots[saving],
                save_to=torch.tensor([cuts[i][r][1] for i in saving], dtype=torch.long, device=slots.device),
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
    """out[seg's rows] = run(seg) for each round, then each save's rows of `states` (the pools [S, …] the run
    advanced) copied to its snapshot slot; returns out ([Tp, …])."""
    for seg in segments(batch):
        seg.put(out, run(seg))
        if seg.save_to.numel():
            for state in states:
                state.index_copy_(0, seg.save_to, torch.index_select(state, 0, seg.save_from))
    return out
