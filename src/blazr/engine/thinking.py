"""Thinking budgets: a sequence's reasoning block ends after at most N tokens — the engine writes the
end-of-thinking marker itself — then the answer (and any structured format) follows.

In:  `ThinkingBudget` on `SamplingParams.thinking` (markers as text, the budget, whether the prompt opened
     the block); the tokenizer turns the markers into ids once per engine (`ThinkingCounter.build`).
Out: per sequence, a `ThinkingCounter`: `forced()` is the token the next step must take (a piece of the
     end marker once the budget is spent, else None); `advance(token)` follows every token appended.

The block: a prompt that opened it (Qwen3's, DeepSeek-R1's templates write `<think>`) starts the output
inside it; otherwise it opens when the output's first tokens spell the start marker (within its length
plus `START_SLACK` tokens, which whitespace before it may take), and never later. It ends when the output
spells the end marker. Forcing starts from whatever prefix of the end marker the model had already written,
so the marker is never doubled. A budget of 0 closes an opened block at once. The forced tokens go through
the grammar like sampled ones (a reasoning block under a format allows the end marker anywhere: engine/
grammar.py's `ThinkFirst`). Added tokens in a marker (Qwen3's `</think>`, harmony's `<|end|>`) are forced as
those tokens, the rest as plain-text tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blazr.errors import BlazrError

if TYPE_CHECKING:
    from blazr.tokenizer import Tokenizer

START_SLACK = 4  # tokens (whitespace) the start marker may come after and still open the block


@dataclass(frozen=True)
class ThinkingBudget:
    """At most `max_tokens` tokens between the start and end markers (`opened`: the prompt opened it)."""

    max_tokens: int
    start: str = "<think>"
    end: str = "</think>"
    opened: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise BlazrError(f"the thinking budget must be ≥ 0, got {self.max_tokens}")
        if not self.start or not self.end:
            raise BlazrError("the thinking markers must be non-empty")


def marker_ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """The ids a model writes `text` as: each added token inside it (Qwen3's `</think>`, harmony's
    `<|channel|>analysis<|message|>` around the word) as that token, the rest as plain-text tokens."""
    added = tokenizer.special_tokens
    inside = sorted((m for m in added if m and m in text), key=len, reverse=True)
    if not inside:
        return tuple(tokenizer.encode_ordinary(text))
    ids: list[int] = []
    for piece in re.split("(" + "|".join(map(re.escape, inside)) + ")", text):
        if piece in added:
            ids.append(added[piece])
        elif piece:
            ids.extend(tokenizer.encode_ordinary(piece))
    return tuple(ids)


class ThinkingCounter:
    """One sequence's place in its reasoning block (see the module docstring)."""

    def __init__(self, budget: ThinkingBudget, start_ids: tuple[int, ...], end_ids: tuple[int, ...]) -> None:
        self.budget = budget.max_tokens
        self.start_ids = start_ids
        self.end_ids = end_ids
        self.state = "thinking" if budget.opened else "before"  # before → thinking → after
        self.num_thinking = 0  # tokens in the block so far (forced end-marker tokens not counted)
        self.is_forcing = False  # the budget is spent: the end marker is being written
        self.forced_pos = 0  # the next end-marker token to force
        self._recent: list[int] = []  # the last tokens, enough to spot a marker

    @staticmethod
    def build(budget: ThinkingBudget, tokenizer: Tokenizer) -> ThinkingCounter:
        start, end = marker_ids(tokenizer, budget.start), marker_ids(tokenizer, budget.end)
        if not start or not end:
            raise BlazrError("the thinking markers have no tokens")
        return ThinkingCounter(budget, start, end)

    def forced(self) -> int | None:
        """The token the next step must take, or None (free)."""
        if self.state != "thinking" or self.num_thinking < self.budget:
            return None
        if not self.is_forcing:  # from where the output already is inside the end marker
            self.is_forcing, self.forced_pos = True, _overlap(self._recent, self.end_ids)
        return self.end_ids[self.forced_pos]

    def advance(self, token: int) -> None:
        """The token just appended to the output."""
        self._recent.append(token)
        keep = max(len(self.start_ids), len(self.end_ids))
        if len(self._recent) > keep + START_SLACK:
            del self._recent[0]
        if self.state == "before":
            if _ends_with(self._recent, self.start_ids):
                self.state = "thinking"
                self._recent.clear()
            elif len(self._recent) >= len(self.start_ids) + START_SLACK:
                self.state = "after"
            return
        if self.state != "thinking":
            return
        if self.is_forcing:
            self.forced_pos += 1
        if _ends_with(self._recent, self.end_ids):
            self.state = "after"
        elif not self.is_forcing:
            self.num_thinking += 1


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    return len(tokens) >= len(marker) and tuple(tokens[-len(marker) :]) == marker


def _overlap(tokens: list[int], marker: tuple[int, ...]) -> int:
    """The length of the longest proper prefix of `marker` that `tokens` ends with."""
    for k in range(min(len(tokens), len(marker) - 1), 0, -1):
        if tuple(tokens[-k:]) == marker[:k]:
            return k
    return 0
