"""Response out: engine outputs in OpenAI's shapes (request_in.py is the way in).

Logprobs in either layout — the legacy completions lists (`tokens`, `token_logprobs`, `top_logprobs` dicts,
`text_offset`, `CompletionLogprobsWriter`) or chat's `content: [{token, logprob, bytes, top_logprobs}]`
(`chat_logprobs`, which the Responses API reuses) — and vLLM's `prompt_logprobs` (one entry per prompt
position, null for the first: `{token id: {logprob, rank, decoded_token}}`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from blazr.engine.sequence import TokenLogprob
from blazr.server.schemas import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprobEntry,
    TopLogprob,
)
from blazr.tokenizer import Tokenizer

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way


def _clamp(value: float) -> float:
    return MIN_LOGPROB if math.isnan(value) or value < MIN_LOGPROB else value


class CompletionLogprobsWriter:
    """Builds the legacy completions `logprobs` object piece by piece (one per stream chunk), carrying the
    text offset across pieces. The top dict holds the top-k alternatives plus the chosen token."""

    def __init__(self, tok: Tokenizer, as_token_ids: bool = False) -> None:
        self.tok = tok
        self.as_token_ids = as_token_ids
        self.offset = 0

    def _name(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.tok.token_text(token_id)

    def prompt(self, prompt_ids: Sequence[int], lps: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        """Echoed prompt tokens; the first one (and any without a logprob) gets null."""
        entries = [(t, lps[i] if i < len(lps) else None) for i, t in enumerate(prompt_ids)]
        return self._write(entries)

    def generated(self, lps: Iterable[TokenLogprob]) -> CompletionLogprobs:
        return self._write([(lp.token_id, lp) for lp in lps])

    def _write(self, entries: Sequence[tuple[int, TokenLogprob | None]]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token_id, lp in entries:
            name = self._name(token_id)
            out.tokens.append(name)
            out.text_offset.append(self.offset)
            self.offset += len(self.tok.token_text(token_id))
            if lp is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_clamp(lp.logprob))
            top = {self._name(t): _clamp(v) for t, v in lp.top}
            top.setdefault(name, _clamp(lp.logprob))
            out.top_logprobs.append(top)
        return out


def merge_completion_logprobs(parts: Iterable[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for p in parts:
        out.tokens += p.tokens
        out.token_logprobs += p.token_logprobs
        out.top_logprobs += p.top_logprobs
        out.text_offset += p.text_offset
    return out


def chat_logprobs(lps: Iterable[TokenLogprob], tok: Tokenizer, as_token_ids: bool = False) -> ChatLogprobs:
    """Chat's layout: every entry with its UTF-8 bytes and the top-k alternatives (possibly [])."""

    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if as_token_ids else tok.token_text(token_id)

    entries = [
        TokenLogprobEntry(
            token=name(lp.token_id),
            logprob=_clamp(lp.logprob),
            bytes=list(tok.token_bytes(lp.token_id)),
            top_logprobs=[
                TopLogprob(token=name(t), logprob=_clamp(v), bytes=list(tok.token_bytes(t)))
                for t, v in lp.top
            ],
        )
        for lp in lps
    ]
    return ChatLogprobs(content=entries)


def prompt_logprobs(
    lps: Sequence[TokenLogprob | None] | None, tok: Tokenizer
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs`: per prompt position the prompt token and its top alternatives by id
    (`rank` 1 = the model's most likely; a prompt token outside the top alternatives asked for gets the
    rank just past them, a lower bound), null for the first position."""
    if lps is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entry: dict[str, dict[str, Any]] = {}
        for rank, (t, v) in enumerate(lp.top, 1):
            entry[str(t)] = {"logprob": _clamp(v), "rank": rank, "decoded_token": tok.token_text(t)}
        if str(lp.token_id) not in entry:
            entry[str(lp.token_id)] = {
                "logprob": _clamp(lp.logprob),
                "rank": len(lp.top) + 1,
                "decoded_token": tok.token_text(lp.token_id),
            }
        out.append(entry)
    return out
