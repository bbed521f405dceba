"""Continuous-batching scheduler: which sequences run in the next step and how many tokens each.

One rule covers prefill, chunked prefill and decode: every running sequence wants
`num_tokens - num_computed_tokens` tokens, granted against a per-step token budget (decodes first, so they
keep flowing while a long prompt is chunked). New sequences join from the waiting queue between steps when
the budget, a state slot and cache blocks allow; a new sequence starts past its longest cached prefix
(`CacheManager`, which owns all cache bookkeeping). When blocks run out, the newest running sequence is
preempted: its cache is freed and it is recomputed later (prompt + what it generated so far, from whatever
of it is still cached).

Speculative decoding (a `Speculator`): a decoding sequence may carry drafted tokens — up to the draft
length, what max_tokens and max_model_len leave room for and the step's token budget — and then wants
u + d tokens (u its tokens to compute: 1, or a few again after a rejected draft rolled its recurrent state
back). Such "row" sequences follow the decodes in the batch (`num_rows` of them): the runner may run each
of their tokens as a decode row. Drafts never preempt: when blocks (or a scratch state slot) for them are
short, the sequence goes on without.

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
from blazr.engine.cache_manager import CacheManager, CacheOps, Fork
from blazr.engine.sequence import Sequence, Status
from blazr.engine.speculative import Speculator


@dataclass
class ScheduledBatch:
    seqs: list[
        Sequence
    ]  # decodes first, then row sequences (drafts; a few tokens again), then prefill chunks
    num_new_tokens: list[int]
    num_decodes: int
    preempted: list[Sequence] = field(default_factory=list)
    cache_ops: CacheOps = field(default_factory=CacheOps)  # snapshot restores / saves for the runner
    num_rows: int = 0  # the row sequences after the decodes (speculative decoding; see the module docstring)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def part(self, b0: int, b1: int) -> ScheduledBatch:
        """Sequences [b0, b1) as a batch of their own (decodes only if b0 = 0), with the cache ops' saves."""
        nd = max(0, min(b1, self.num_decodes) - b0)
        ops = CacheOps(saves=self.cache_ops.saves)
        return ScheduledBatch(self.seqs[b0:b1], self.num_new_tokens[b0:b1], nd, cache_ops=ops)


class Scheduler:
    def __init__(self, cfg: EngineConfig, cache: CacheManager, speculator: Speculator | None = None) -> None:
        self.cfg = cfg
        self.cache = cache
        self.speculator = speculator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._reserved = 0  # sequences promised to pending forks (n > 1)
        self.num_preemptions = 0  # cumulative
        # (sequence, num_computed_tokens it must reach alone) after a failed multi-request step
        self._quarantine: deque[tuple[Sequence, int]] = deque()

    # ------------------------------------------------------------------------------------------ queue

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence: after every waiting one of the same or a lower `priority` value."""
        p = seq.params.priority
        if not self.waiting or self.waiting[-1].params.priority <= p:
            self.waiting.append(seq)
            return
        at = next(i for i, s in enumerate(self.waiting) if s.params.priority > p)
        self.waiting.insert(at, seq)

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

    def _release(self, seq: Sequence) -> None:
        self.cache.release(seq)
        if seq.fork_pending:
            self._reserved -= seq.fork_pending

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed_tokens = 0
        if not seq.output_ids:
            seq.prompt_logprobs = []  # scored again from the first chunk
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        quarantined = self._next_quarantined()
        if quarantined is not None:
            return self._schedule_alone(quarantined)
        budget = self.cfg.max_num_batched_tokens
        decodes: list[Sequence] = []
        drafted: list[tuple[Sequence, int]] = []
        prefills: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []
        drafts = self._propose(budget)
        for seq in list(self.running):
            if seq not in self.running:  # preempted below to make room for an older sequence
                continue
            want = seq.num_uncomputed
            num_new = min(want, budget)
            if num_new <= 0:
                continue
            if seq.seq_id in drafts and self._draft(seq, drafts[seq.seq_id][: budget - want], want):
                drafted.append((seq, want + len(seq.draft_ids)))
                budget -= want + len(seq.draft_ids)
                continue
            while not self.cache.grow(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            budget -= num_new
            if self._is_decode(seq, want):
                decodes.append(seq)
            elif num_new == want and self._is_rows(seq, want):
                drafted.append((seq, num_new))
            else:
                prefills.append((seq, num_new))
        if not preempted:
            self._admit(budget, prefills)
        seqs = decodes + [s for s, _ in drafted + prefills]
        num_new = [1] * len(decodes) + [n for _, n in drafted + prefills]
        return self._batch(seqs, num_new, len(decodes), preempted, len(drafted))

    @staticmethod
    def _is_decode(seq: Sequence, want: int) -> bool:
        return want == 1 and bool(seq.output_ids) and seq.num_computed_tokens == seq.num_tokens - 1

    def _is_rows(self, seq: Sequence, want: int) -> bool:
        """A generating sequence with a few tokens to compute (again, after a rejected draft): at most a
        verification's worth, so its tokens may run as decode rows."""
        k = self.cfg.num_speculative_tokens
        return bool(k) and bool(seq.output_ids) and not seq.fork_pending and 1 <= want <= 1 + k

    def _propose(self, budget: int) -> dict[int, list[int]]:
        """The drafts of this step's decoding sequences (seq_id → tokens), each at most what max_tokens,
        max_model_len and the step's token budget leave room for."""
        if self.speculator is None:
            return {}
        wants = [
            (seq, min(
                budget - seq.num_uncomputed,
                seq.params.max_tokens - len(seq.output_ids) - 1,  # the step appends up to d + 1 tokens
                self.cfg.max_model_len - seq.num_tokens,  # drafts take positions num_tokens …
            ))
            for seq in self.running
            if self._is_rows(seq, seq.num_uncomputed)
        ]  # fmt: skip
        return self.speculator.propose(wants)

    def _draft(self, seq: Sequence, drafts: list[int], want: int) -> bool:
        """Give a decoding sequence (`want` tokens to compute) its drafts for this step, with blocks and
        (recurrent state) a scratch slot for them; False when it has none (it then goes on without)."""
        if not drafts or not self.cache.grow(seq, want + len(drafts)):
            return False
        if not self.cache.reserve_drafts(seq):
            return False
        seq.draft_ids = drafts
        return True

    def _batch(
        self,
        seqs: list[Sequence],
        num_new: list[int],
        num_decodes: int,
        preempted: list[Sequence],
        num_rows: int = 0,
    ) -> ScheduledBatch:
        for i, (seq, n) in enumerate(zip(seqs, num_new, strict=True)):
            # row sequences save no snapshot: a drafted step's boundaries are not known to stand yet, and
            # decode rows cannot save inside a step
            is_rows = num_decodes <= i < num_decodes + num_rows
            self.cache.plan_saves(seq, 0 if is_rows else n)
        ops = self.cache.take_ops()
        return ScheduledBatch(seqs, num_new, num_decodes, preempted, ops, num_rows)

    def _admit(self, budget: int, prefills: list[tuple[Sequence, int]]) -> None:
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            num_new = self._try_admit(seq, budget)
            if not num_new:
                break
            prefills.append((seq, num_new))
            budget -= num_new

    def _try_admit(self, seq: Sequence, budget: int) -> int:
        """Move a waiting sequence to running with a state slot and cache for its next tokens (up to
        `budget`, past its cached prefix): how many it computes this step, or 0 if it cannot start."""
        extra = 1 + seq.fork_pending
        if len(self.running) + self._reserved + extra > self.cfg.max_num_seqs:
            return 0
        if self.cache.num_free_slots() < extra + self._reserved:
            return 0
        num_new = self.cache.admit(seq, budget)
        if not num_new:
            return 0
        self.waiting.remove(seq)
        self._reserved += seq.fork_pending
        seq.status = Status.RUNNING
        self.running.append(seq)
        return num_new

    # ------------------------------------------------------------------------------------- quarantine

    def quarantine(self, batch: ScheduledBatch) -> None:
        """A step holding several requests failed: preempt all of its sequences (their caches may be half
        written) and run each alone until it has passed the point the failed step would have reached."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            target = seq.num_computed_tokens + n - len(seq.draft_ids)  # drafts: only its own tokens are due
            seq.draft_ids = []
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
        budget = self.cfg.max_num_batched_tokens
        preempted: list[Sequence] = []
        if seq.status is Status.WAITING:
            while not (num_new := self._try_admit(seq, budget)):
                victim = self.running[-1]  # room is always there once the others are out
                self._preempt(victim)
                preempted.append(victim)
        else:
            num_new = min(seq.num_uncomputed, budget)
            while not self.cache.grow(seq, num_new):
                victim = next(s for s in reversed(self.running) if s is not seq)
                self._preempt(victim)
                preempted.append(victim)
        is_decode = num_new == 1 and self._is_decode(seq, seq.num_uncomputed)
        return self._batch([seq], [num_new], int(is_decode), preempted)

    # ----------------------------------------------------------------------------------------- update

    def commit(self, sched: ScheduledBatch) -> None:
        """`sched` ran and its sequences' `num_computed_tokens` moved on: the cache names what it wrote."""
        self.cache.commit(sched.seqs)

    def rollback(self, sched: ScheduledBatch) -> None:
        """The scheduled step failed before anything of it was kept (its drafts are dropped too)."""
        for seq in sched.seqs:
            seq.draft_ids = []
        self.cache.rollback()

    def fork(self, parent: Sequence, children: list[Sequence]) -> Fork:
        """Give `children` the parent's cache (shared full blocks, copies of the partial last block and of
        the recurrent state). Called right after the parent's prefill completes; a child that finds no
        block for its copy waits and is computed on its own."""
        assert len(children) <= parent.fork_pending
        parent.fork_pending -= len(children)
        self._reserved -= len(children)
        fork, left_out = self.cache.fork(parent, children)
        for child in fork.children:
            child.status = Status.RUNNING
            self.running.append(child)
        for child in left_out:
            child.num_computed_tokens = 0
            child.status = Status.WAITING
            self.waiting.appendleft(child)
        return fork

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished and free its blocks and state slot at once."""
        if seq.status is Status.FINISHED:
            return
        self._release(seq)
        if self.speculator is not None:
            self.speculator.forget(seq)
        seq.fork_pending = 0
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
