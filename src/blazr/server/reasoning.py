"""Reasoning split from content: the `<think>…</think>` block of reasoning models (DeepSeek-R1, Qwen3),
incrementally, for `reasoning_content` beside `content`.

In:  the end of the rendered prompt (did the template open the block?), then the output text in pieces
     (detokenized deltas; a piece may cut a marker anywhere).
Out: `ReasoningDelta(reasoning, content)` per piece; `finish()` flushes what was held back. Non-streaming is
     the same parser fed the whole text then finished (`split_reasoning`), so streamed deltas always
     reassemble to exactly the non-streamed answer.

Rules:
  - Output that starts (after whitespace) with `<think>` is reasoning until `</think>`; the markers and
    that leading whitespace are dropped. A prompt whose last `<think>` comes after its last `</think>`
    (DeepSeek-R1's template, Qwen3's thinking ones) opened the block: the output is reasoning from its
    first character (a repeated `<think>` at its start is dropped too).
  - After `</think>`, the whitespace run that follows it (Qwen3 writes "\\n\\n") is dropped: content starts at
    the first other character, as Qwen3's template strips it when it renders the turn back.
  - Output with no opening marker (and a prompt that did not open the block) is all content, a later
    `<think>` or `</think>` included: a `</think>` alone is not taken as the end of an unmarked block (that
    would hold all content back until the end).
  - A suffix that may still become a marker is held back, never sent as text; at the end it is text.
  - The output ending inside the block leaves it all reasoning (`in_reasoning` stays True).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

WS = " \t\r\n"


@dataclass(frozen=True)
class ReasoningDelta:
    """What one piece of output turned into."""

    reasoning: str = ""
    content: str = ""


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may still become it)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ReasoningParser:
    """Incremental `start…end` splitter. States: "start" (the output's first characters: whitespace and
    maybe `start`), "reasoning", "after" (whitespace after `end`), "content"."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"

    def __init__(self, prompt_text_tail: str) -> None:
        self.opened_by_prompt = prompt_text_tail.rfind(self.start) > prompt_text_tail.rfind(self.end)
        self._state = "start"
        self._buf = ""
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @property
    def in_reasoning(self) -> bool:
        """Still inside the block (or, before the output's first characters, about to be)."""
        return self._state == "reasoning" or (self._state == "start" and self.opened_by_prompt)

    def feed(self, text: str) -> ReasoningDelta:
        """The next piece of output."""
        self._buf += text
        while self._step(False):
            pass
        return self._take()

    def finish(self) -> ReasoningDelta:
        """End of output: what was held back is text of the part it was in."""
        while self._step(True):
            pass
        return self._take()

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._state == "start":
            rest = buf.lstrip(WS)
            if rest.startswith(self.start):
                self._buf, self._state = rest[len(self.start) :], "reasoning"
                return True
            if not final and self.start.startswith(rest):  # only whitespace, or a prefix of the marker
                return False
            self._state = "reasoning" if self.opened_by_prompt else "content"
            return True
        if self._state == "reasoning":
            k = buf.find(self.end)
            if k >= 0:
                self._add(self._reasoning, buf[:k])
                self._buf, self._state = buf[k + len(self.end) :], "after"
                return True
            keep = 0 if final else _held_prefix(buf, self.end)
            self._add(self._reasoning, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if self._state == "after":
            self._buf = buf.lstrip(WS)
            if not self._buf:
                return False
            self._state = "content"
        self._add(self._content, self._buf)
        self._buf = ""
        return False

    @staticmethod
    def _add(out: list[str], text: str) -> None:
        if text:
            out.append(text)

    def _take(self) -> ReasoningDelta:
        out = ReasoningDelta("".join(self._reasoning), "".join(self._content))
        self._reasoning, self._content = [], []
        return out


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}
# --reasoning-parser may also name a chat format that splits channels itself (server/chat_format.py)
CHANNEL_FORMATS = ("harmony",)


def split_reasoning(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """Non-streaming: `text` fed whole to a fresh `parser`, then finished: (reasoning, content), None for
    an empty part."""
    parts = [parser.feed(text), parser.finish()]
    reasoning = "".join(p.reasoning for p in parts)
    content = "".join(p.content for p in parts)
    return reasoning or None, content or None
