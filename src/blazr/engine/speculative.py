"""Speculator: which tokens a decoding sequence drafts this step, how many, and what came of them.

Speculative decoding checks several tokens per read of the weights. A decoding sequence whose next tokens
can be guessed carries them as drafts: the step computes its last token and the k drafts in one forward
(engine/runner.py: stateless models as k + 1 decode rows of the recorded plan, models with recurrent state
as one chunk whose per-position states are kept), and the engine samples position after position — the
target's own sampler, with the request's penalties, grammar, seed — keeping drafts while the sampled token
equals the draft (engine/engine.py `_verify`). A deterministic draft makes this rejection sampling exact:
a token is accepted with the target's probability of it and otherwise replaced by a draw from the rest of
the target's distribution, so the output is distributed as without speculation — and, since each sampled
token takes one draw of the request's generator, is the same token for token under a seed.

Drafts come from a `DraftSource`: the sequence itself (`NgramSource`, prompt lookup); the benchmark's replay
mode and the tests hand in their own (drafts that are the known continuation, or that differ from it at a
chosen position).

Adaptive length (on by default): a draft pays when the tokens it is expected to yield outweigh what its
extra rows cost. Each sequence keeps a decayed estimate α of the chance a drafted token is accepted (kept
drafts over drafts seen, each verification weighted `DECAY` times the one after it; seen = those up to and
including the first rejected one). A draft of d tokens yields E(d) = 1 + α + … + α^d tokens for a step that
costs c(d) plain decode steps; the next draft is the length d ≤ k that maximises E(d) / c(d), and none when
no length beats plain decoding by `MIN_GAIN`. c(d) is measured on the host (`StepCosts`): the engine reports
every decode-only step's wall time by its rows, and c(d) = t(B·(1 + d)) / t(B) for B decoding sequences —
what the kernels really charge for more rows, which is not linear (a kernel that runs up to 8 activation
rows in one pass over the weights charges little for the 5th row and a second pass for the 9th). Until a
row count is measured, a row costs β of a step (`ROW_COST_PLAN` when drafts run as rows of the recorded
decode plan, `ROW_COST_CHUNK` when they run as a chunk). A sequence that drafts nothing probes with one
token after a backoff that doubles (4, 8, … up to `MAX_BACKOFF` steps), so its estimate can recover — text
that does not repeat then costs a lookup per step and a rare one-token probe.

Counters (Prometheus, vLLM's spec-decode names): drafts, drafted tokens, accepted tokens, accepted tokens per
draft position.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from blazr.config import SpeculativeConfig
from blazr.engine.ngram import NgramIndex
from blazr.engine.sequence import Sequence

MAX_BACKOFF = 64  # steps a sequence whose drafts do not pay waits, at most, before probing again
DECAY = 0.7  # weight of a verification in the acceptance estimate, against the one after it
PRIOR = (1.2, 2.0)  # the estimate's starting (accepted, seen): α = 0.6
MIN_GAIN = 1.05  # a draft must be expected to beat plain decoding by this factor
# a verification's cost per drafted row, in decode steps (benchmarks/speculative.py, Zen 5, k = 4: SmolLM2
# Q4_1 on the plan 1.6 for 4 rows; the granite-4.0-h-350m shape as a chunk 2.2)
ROW_COST_PLAN = 0.15
ROW_COST_CHUNK = 0.3


STEP_SAMPLES = 5  # the latest wall times kept per row count: their median is its step time
STALE_STEPS = 256  # a row count not seen for this many decode steps is measured afresh (the prior until then)


def best_length(alpha: float, k: int, cost: float | Callable[[int], float]) -> int:
    """The draft length d ≤ k that maximises the expected tokens per unit of cost, E(d) / c(d) — c(d) the
    step's cost in plain decode steps, `cost(d)`, or 1 + cost·d for a per-row cost; 0 when none beats plain
    decoding by MIN_GAIN."""
    best, best_gain, expected = 0, MIN_GAIN, 1.0
    for d in range(1, k + 1):
        expected += alpha**d
        gain = expected / (cost(d) if callable(cost) else 1 + cost * d)
        if gain > best_gain:
            best, best_gain = d, gain
    return best


class StepCosts:
    """What a decode step costs by its rows, measured: t(R), the median wall time of the latest decode-only
    steps of R rows (every sequence's token, plus its drafts), and from it the cost of drafting. The first
    step of a row count is not a sample (it records that batch size's decode plan); a row count not seen
    for `STALE_STEPS` steps counts as unmeasured until it is seen again, so one slow step (the host busy)
    cannot keep a length from ever being tried again."""

    def __init__(self, row_cost: float) -> None:
        """`row_cost` β: a drafted row's cost in decode steps where nothing is measured."""
        self.row_cost = row_cost
        self._steps = 0  # decode-only steps observed
        self._last: dict[int, int] = {}  # rows → the step that last had that many
        self._samples: dict[int, deque[float]] = {}  # rows → its latest wall times (seconds)
        self._median: dict[int, float] = {}  # rows → the median of its samples (kept as they arrive)

    def observe(self, rows: int, seconds: float) -> None:
        """A decode-only step of `rows` rows took `seconds`."""
        self._steps += 1
        last = self._last.get(rows)
        self._last[rows] = self._steps
        if last is None:  # the batch size's first step: its plan recorded, not a sample
            return
        samples = self._samples.setdefault(rows, deque(maxlen=STEP_SAMPLES))
        if self._steps - last > STALE_STEPS:
            samples.clear()
        samples.append(seconds)
        self._median[rows] = statistics.median(samples)

    def time(self, rows: int) -> float | None:
        """t(rows), or None while unmeasured (or stale)."""
        t = self._median.get(rows)
        return None if t is None or self._steps - self._last[rows] > STALE_STEPS else t

    def factor(self, seqs: int, d: int) -> float:
        """A step in which each of `seqs` decoding sequences carries d drafts, in plain steps of those
        sequences: t(seqs·(1 + d)) / t(seqs); an unmeasured row count is the nearest measured one below it
        plus β of a plain step per sequence for every row more, and 1 + β·d before t(seqs) is known."""
        base = self.time(seqs)
        if base is None:
            return 1 + self.row_cost * d
        rows = seqs * (1 + d)
        t = self.time(rows)
        if t is None:
            below = max(r for r in self._median if seqs <= r < rows and self.time(r) is not None)
            t = self._median[below] + self.row_cost * base / seqs * (rows - below)
        return max(t / base, 1.0)


class DraftSource(Protocol):
    """Where drafts come from: for each (sequence, n), up to n tokens to follow the sequence's tokens — all
    the step's sequences at once, so a draft model drafts them in one batch."""

    def propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]: ...

    def forget(self, seq: Sequence) -> None: ...


class NgramSource:
    """Prompt lookup: each sequence's `NgramIndex`, fed with its tokens as they arrive."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._indexes: dict[int, NgramIndex] = {}  # seq_id → its index

    def propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        return [self._propose(seq, n) for seq, n in wants]

    def _propose(self, seq: Sequence, n: int) -> list[int]:
        index = self._indexes.get(seq.seq_id)
        if index is None:
            index = self._indexes[seq.seq_id] = NgramIndex(self.n_min, self.n_max)
        have, num_prompt = len(index), seq.num_prompt_tokens
        if have < num_prompt:
            index.extend(seq.prompt_ids[have:])
            have = num_prompt
        index.extend(seq.output_ids[have - num_prompt :])
        return index.propose(n)

    def forget(self, seq: Sequence) -> None:
        self._indexes.pop(seq.seq_id, None)


@dataclass
class DraftState:
    """One sequence's drafting: its acceptance estimate and its backoff."""

    accepted: float = PRIOR[0]  # decayed counts of drafted tokens accepted and seen
    seen: float = PRIOR[1]
    skip: int = 0  # steps left without drafting
    backoff: int = 0  # the last skip (0: none yet)

    @property
    def alpha(self) -> float:
        return self.accepted / self.seen


@dataclass
class SpecStats:
    """Cumulative counts over every verification."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


class Speculator:
    """Drafts for decoding sequences (`propose`) and what their verification kept (`record`)."""

    def __init__(
        self, cfg: SpeculativeConfig, source: DraftSource | None = None, row_cost: float = ROW_COST_PLAN
    ) -> None:
        """`row_cost`: what a drafted row adds to a step, in decode steps (the adaptive length's β)."""
        if source is None and cfg.method != "ngram":
            raise ValueError(f"speculative method {cfg.method!r}: no draft source given")
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens
        self.costs = StepCosts(row_cost)
        self.source: DraftSource = source or NgramSource(cfg.ngram_min, cfg.ngram_max)
        self.stats = SpecStats(accepted_per_position=[0] * self.k)
        self._states: dict[int, DraftState] = {}  # seq_id → its drafting

    def propose(self, wants: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Drafts for decoding sequences, each (sequence, at most this many): seq_id → up to that many
        tokens to follow its tokens (its last one not yet computed); a sequence backing off gets none."""
        asks: list[tuple[Sequence, int]] = []
        # c(1) … c(k) for this step's count of decoding sequences, once for them all
        costs = [self.costs.factor(len(wants), d) for d in range(1, self.k + 1)] if self.cfg.adaptive else []
        for seq, limit in wants:
            n = self._length(seq, costs) if self.cfg.adaptive else self.k
            if n and limit > 0:
                asks.append((seq, min(limit, n)))
        if not asks:
            return {}
        drafts = self.source.propose(asks)
        return {seq.seq_id: d[:n] for (seq, n), d in zip(asks, drafts, strict=True) if d}

    def _length(self, seq: Sequence, costs: list[float]) -> int:
        """The adaptive draft length of `seq` this step, a draft of d costing costs[d − 1] plain steps
        (0: none; see the module docstring)."""
        state = self._states.get(seq.seq_id)
        if state is None:
            state = self._states[seq.seq_id] = DraftState()
        if state.skip:
            state.skip -= 1
            return 0
        n = best_length(state.alpha, self.k, lambda d: costs[d - 1])
        if n:
            return n
        state.backoff = min(MAX_BACKOFF, max(4, 2 * state.backoff))
        state.skip = state.backoff
        return 1  # a probe, then the backoff

    def observe_step(self, rows: int, seconds: float) -> None:
        """A decode-only step (every sequence one token and its drafts, no prefill) of `rows` rows took
        `seconds` of wall time: the adaptive length's cost of rows (`StepCosts`)."""
        self.costs.observe(rows, seconds)

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """A verification of `num_drafted` drafts of `seq` kept the first `num_accepted`."""
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += num_drafted
        s.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            s.accepted_per_position[i] += 1
        state = self._states.get(seq.seq_id)
        if state is None or not self.cfg.adaptive:
            return
        seen = num_accepted + (num_accepted < num_drafted)  # up to the first rejected draft
        state.accepted = DECAY * state.accepted + num_accepted
        state.seen = DECAY * state.seen + seen
        if num_accepted:
            state.backoff = 0

    def forget(self, seq: Sequence) -> None:
        """`seq` finished: its drafting state goes."""
        self._states.pop(seq.seq_id, None)
        self.source.forget(seq)


class ReplaySource:
    """Drafts that are a known continuation of each prompt (the benchmark's replay mode: every draft is
    accepted under greedy decoding), optionally wrong at one position per draft — `wrong_at(i)` for the
    i-th draft of a sequence (None: all right) — so a verification rejects exactly there."""

    def __init__(
        self,
        continuations: dict[tuple[int, ...], list[int]],
        vocab_size: int,
        wrong_at: Callable[[int], int | None] | None = None,
    ) -> None:
        self.continuations = continuations
        self.vocab_size = vocab_size
        self.wrong_at = wrong_at
        self._count: dict[int, int] = {}  # seq_id → drafts proposed

    def propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        return [self._propose(seq, n) for seq, n in wants]

    def _propose(self, seq: Sequence, n: int) -> list[int]:
        known = self.continuations.get(tuple(seq.prompt_ids), [])
        done = len(seq.output_ids)
        drafts = list(known[done : done + n])
        i = self._count[seq.seq_id] = self._count.get(seq.seq_id, -1) + 1
        j = self.wrong_at(i) if self.wrong_at is not None else None
        if j is not None and j < len(drafts):
            drafts[j] = (drafts[j] + 1) % self.vocab_size
        return drafts

    def forget(self, seq: Sequence) -> None:
        self._count.pop(seq.seq_id, None)
