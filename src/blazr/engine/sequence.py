"""Sequence: one stream of tokens being generated, with the counters the scheduler works from.

`num_tokens - num_computed_tokens` is the work left before the next sample: the whole prompt at first (a
prefill, possibly in chunks), then 1 per step (a decode). A request with n > 1 owns n sequences that share
the prompt's cache blocks after one prefill. A prefix-cache hit at admission starts `num_computed_tokens` past
the cached prefix.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from blazr.engine.grammar import GrammarMatcher
from blazr.engine.sampling import SamplingParams
from blazr.engine.thinking import ThinkingCounter

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    """The raw-model logprob of a chosen token and the top alternatives at that position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # which of the request's n samples
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    # one block table per KV group (state/layout.py), indexed by block number; a sliding group's entries
    # for blocks that left its window are `DROPPED` (engine/cache_manager.py)
    block_tables: list[list[int]] = field(default_factory=lambda: [[]])
    state_slot: int | None = None
    generator: torch.Generator | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    fork_pending: int = 0  # n - 1 siblings to fork from this sequence once its prefill completes
    # prefix cache (state/cache_manager.py): hashes of full blocks, how many of block_table's blocks are
    # named by theirs, the hash of the newest rolling state snapshot, and the hit at first admission
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0
    latest_snapshot: bytes | None = None
    num_cached_tokens: int = 0
    grammar: GrammarMatcher | None = None  # structured output: where its output stands in the grammar
    thinking: ThinkingCounter | None = None  # a thinking budget: where its output stands in the block
    pooled: torch.Tensor | None = None  # an embedding request: its prompt's hidden states pooled so far
    # speculative decoding: tokens drafted to follow the last one, verified in the scheduled step
    draft_ids: list[int] = field(default_factory=list)

    @property
    def block_table(self) -> list[int]:
        """The first KV group's block table (the full-attention one, when the model has one)."""
        return self.block_tables[0]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def token_at(self, position: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]

    def step_tokens(self, start: int, n: int) -> list[int]:
        """The `n` input tokens of a step that starts at `start`: the sequence's own, then its drafts."""
        end = min(start + n, self.num_tokens)
        return self.tokens(start, end) + self.draft_ids[: start + n - end]

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end the sequence: EOS (unless ignore_eos) and the request's stop_token_ids."""
        ids = frozenset(self.params.stop_token_ids)
        return ids if self.params.ignore_eos else ids | self.eos_ids
