"""Incremental detokenization with stop strings.

Text is produced token by token through the tokenizer's UTF-8-safe streaming decoder. With stop strings,
the last `len(longest stop) - 1` characters are held back until they can no longer begin a stop string, so
a client never receives text that is later cut. On a match the text is truncated at the stop (or just after
it with `include_stop`), and the sequence finishes. Tokens added with `check_stop=False` (the first
`min_tokens`) are emitted at once and never searched: a later match must begin after them.
"""

from __future__ import annotations

from typing import Protocol


class StreamDecoder(Protocol):
    def add(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class Detokenizer:
    def __init__(self, decoder: StreamDecoder, stop: list[str], include_stop: bool = False) -> None:
        self.decoder = decoder
        self.stop = stop
        self.include_stop = include_stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.emitted = 0  # characters of `text` already handed out
        self.unsearched = 0  # characters of `text` a stop string may begin at or after

    def add(self, token_id: int, check_stop: bool = True) -> tuple[str, bool]:
        """Feed one generated token; returns (new text to emit, whether a stop string matched)."""
        piece = self.decoder.add(token_id)
        if not piece:
            return "", False
        start = max(self.unsearched, len(self.text) - self.hold)
        self.text += piece
        if not check_stop:
            self.unsearched = len(self.text)
            return self._take(len(self.text)), False
        if self.stop:
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                i, s = min(hits)
                self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
                return self._take(len(self.text)), True
        return self._take(len(self.text) - self.hold), False

    def finish(self) -> str:
        """The sequence ended for another reason: flush the decoder and release held-back text."""
        tail = self.decoder.flush()
        if tail:
            self.text += tail
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
