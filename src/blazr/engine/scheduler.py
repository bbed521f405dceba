"""Continuous-batching scheduler: which sequences run in the next step and how many tokens each.

One rule covers prefill, chunked prefill and decode: every running sequence wants
`num_tokens - num_computed_tokens` tokens, granted against a per-step token budget (decodes first, so they
keep flowing while a long prompt is chunked). New sequences join from the waiting queue between steps when
the budget, a state slot and cache blocks allow. When blocks run out, the newest running sequence is
preempted: its cache is freed and it is recomputed later (prompt + what it generated so far).

Quarantine: when a step that held several requests fails, the engine cannot tell which request caused it,
and the step may have half-written their caches. `quarantine(batch)` preempts every sequence of that step
and queues it to run alone — one sequence per step, nothing else admitted — until it is back where the
failed step would have taken it. A sequence that fails again while alone is the cause (the engine fails
its request); the others pass and rejoin the batch, so innocent requests only pay a recompute.

Pure bookkeeping — no tensors — so it is tested with a fake runner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from blazr.config import EngineConfig
from blazr.engine.sequence import Sequence, Status
from blazr.state.allocator import BlockAllocator, SlotAllocator


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]  # decodes first, then prefill (chunks)
    num_new_tokens: list[int]
    num_decodes: int
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass
class Fork:
    """Children created from a parent whose prefill completed, and the cache copies they need."""

    children: list[Sequence]
    block_copies: list[tuple[int, int]]  # (src block, dst block): the partially filled last block
    state_copies: list[tuple[int, int]]  # (src slot, dst slot)


class Scheduler:
    def __init__(
        self,
        cfg: EngineConfig,
        blocks: BlockAllocator | None,
        slots: SlotAllocator | None,
    ) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.slots = slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._reserved = 0  # sequences promised to pending forks (n > 1)
        # (sequence, num_computed_tokens it must reach alone) after a failed multi-request step
        self._quarantine: deque[tuple[Sequence, int]] = deque()

    # ------------------------------------------------------------------------------------------ queue

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_quarantined(self) -> int:
        return len(self._quarantine)

    # --------------------------------------------------------------------------------------- schedule

    def _blocks_needed(self, seq: Sequence, num_new: int) -> int:
        if self.blocks is None:
            return 0
        return self.blocks.blocks_needed(seq.num_computed_tokens + num_new, len(seq.block_table))

    def _grow(self, seq: Sequence, num_new: int) -> bool:
        need = self._blocks_needed(seq, num_new)
        if need == 0:
            return True
        assert self.blocks is not None
        if not self.blocks.can_allocate(need):
            return False
        seq.block_table.extend(self.blocks.allocate(need))
        return True

    def _release(self, seq: Sequence) -> None:
        if self.blocks is not None and seq.block_table:
            self.blocks.free(seq.block_table)
        seq.block_table = []
        if self.slots is not None and seq.state_slot is not None:
            self.slots.free(seq.state_slot)
        seq.state_slot = None
        if seq.fork_pending:
            self._reserved -= seq.fork_pending

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        quarantined = self._next_quarantined()
        if quarantined is not None:
            return self._schedule_alone(quarantined)
        budget = self.cfg.max_num_batched_tokens
        decodes: list[Sequence] = []
        prefills: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted below to make room for an older sequence
                continue
            want = seq.num_uncomputed
            num_new = min(want, budget)
            if num_new <= 0:
                continue
            while not self._grow(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            budget -= num_new
            if want == 1 and seq.output_ids and seq.num_computed_tokens == seq.num_tokens - 1:
                decodes.append(seq)
            else:
                prefills.append((seq, num_new))
        if not preempted:
            self._admit(budget, prefills)
        seqs = decodes + [s for s, _ in prefills]
        num_new = [1] * len(decodes) + [n for _, n in prefills]
        return ScheduledBatch(seqs, num_new, len(decodes), preempted)

    def _admit(self, budget: int, prefills: list[tuple[Sequence, int]]) -> None:
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            num_new = min(seq.num_uncomputed, budget)
            if not self._try_admit(seq, num_new):
                break
            prefills.append((seq, num_new))
            budget -= num_new

    def _try_admit(self, seq: Sequence, num_new: int) -> bool:
        """Move a waiting sequence to running with a state slot and blocks for `num_new` tokens."""
        extra = 1 + seq.fork_pending
        if len(self.running) + self._reserved + extra > self.cfg.max_num_seqs:
            return False
        if self.slots is not None and self.slots.num_free < extra + self._reserved:
            return False
        if not self._grow(seq, num_new):
            return False
        self.waiting.remove(seq)
        if self.slots is not None:
            seq.state_slot = self.slots.allocate()
        self._reserved += seq.fork_pending
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    # ------------------------------------------------------------------------------------- quarantine

    def quarantine(self, batch: ScheduledBatch) -> None:
        """A step holding several requests failed: preempt all of its sequences (their caches may be half
        written) and run each alone until it has passed the point the failed step would have reached."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            target = seq.num_computed_tokens + n
            if seq.status is Status.RUNNING:
                self._preempt(seq)
            self._quarantine.append((seq, target))

    def _next_quarantined(self) -> Sequence | None:
        """The first quarantined sequence still short of its target (those past it are released)."""
        while self._quarantine:
            seq, target = self._quarantine[0]
            if seq.status is not Status.FINISHED and seq.num_computed_tokens < target:
                return seq
            self._quarantine.popleft()
        return None

    def _schedule_alone(self, seq: Sequence) -> ScheduledBatch:
        """One step holding only `seq` (its next prefill chunk, or its decode), making room if needed."""
        num_new = min(seq.num_uncomputed, self.cfg.max_num_batched_tokens)
        preempted: list[Sequence] = []
        if seq.status is Status.WAITING:
            while not self._try_admit(seq, num_new):
                victim = self.running[-1]  # room is always there once the others are out
                self._preempt(victim)
                preempted.append(victim)
        else:
            while not self._grow(seq, num_new):
                victim = next(s for s in reversed(self.running) if s is not seq)
                self._preempt(victim)
                preempted.append(victim)
        is_decode = num_new == 1 and bool(seq.output_ids) and seq.num_computed_tokens == seq.num_tokens - 1
        return ScheduledBatch([seq], [num_new], int(is_decode), preempted)

    # ----------------------------------------------------------------------------------------- update

    def fork(self, parent: Sequence, children: list[Sequence]) -> Fork:
        """Give `children` the parent's cache: shared full blocks, a copy of the partial last block, a copy
        of the recurrent state. Called right after the parent's prefill completes."""
        assert len(children) <= parent.fork_pending
        parent.fork_pending -= len(children)
        self._reserved -= len(children)
        block_copies, state_copies = [], []
        for child in children:
            child.num_computed_tokens = parent.num_computed_tokens
            child.status = Status.RUNNING
            if self.blocks is not None:
                filled = parent.num_computed_tokens
                num_full = filled // self.blocks.block_size
                shared = parent.block_table[:num_full]
                self.blocks.share(shared)
                child.block_table = list(shared)
                if num_full < len(parent.block_table):
                    # always possible: blocks freed by nothing else are at least the reserved ones
                    if not self.blocks.can_allocate(1):
                        self.blocks.free(child.block_table)
                        child.block_table = []
                        child.num_computed_tokens = 0
                        child.status = Status.WAITING
                        self.waiting.appendleft(child)
                        continue
                    (fresh,) = self.blocks.allocate(1)
                    block_copies.append((parent.block_table[num_full], fresh))
                    child.block_table.append(fresh)
            if self.slots is not None:
                child.state_slot = self.slots.allocate()
                assert parent.state_slot is not None
                state_copies.append((parent.state_slot, child.state_slot))
            self.running.append(child)
        return Fork(
            [c for c in children if c.status is Status.RUNNING],
            block_copies,
            state_copies,
        )

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished and free its blocks and state slot at once."""
        if seq.status is Status.FINISHED:
            return
        self._release(seq)
        seq.fork_pending = 0
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
