"""The base of the tool-call parsers: what one piece of output turns into (`ParsedDelta`), a whole call
(`ToolCall`), and `ToolParser` — the buffer, the held-back framing, the call being scanned — that each
format's state machine (tool_parsers.py, harmony.py) builds on. The rules every parser keeps (streaming,
framing, malformed calls) are in tool_parsers.py's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from blazr.server.tool_call_text import WS, CallText, ToolCallDelta
from blazr.server.tool_grammar import call_grammar


@dataclass(frozen=True)
class ParsedDelta:
    """What one piece of output turned into: content text and tool-call pieces (at most one per call). Within
    one delta the order of content and calls is not kept: content before a call and text after it may come
    in the same delta (whole text fed at once); send the content first."""

    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    reasoning: str = ""  # a parser of the whole format (harmony: `splits_channels`) splits reasoning too


@dataclass(frozen=True)
class ToolCall:
    """A whole tool call; `arguments` is JSON text (an object unless the call broke after its name)."""

    id: str
    name: str
    arguments: str


# ------------------------------------------------------------------------------------------- parsers


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may still become it)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _squash(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """One delta per call: consecutive pieces of the same call merged (id and name from the first)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            last = out[-1]
            out[-1] = ToolCallDelta(
                last.index, last.id or d.id, last.name or d.name, last.arguments + d.arguments
            )
        else:
            out.append(d)
    return tuple(out)


class ToolParser:
    """Base of the incremental parsers: the buffer of text not yet decided, the framing text `held` (a
    marker, whitespace) that is content if no call follows, the call being parsed, and what one `feed`
    produced. Subclasses implement `_step`, one move of their state machine (False when it must wait)."""

    name: ClassVar[str]
    needs_special_tokens: ClassVar[bool] = False  # markers are control tokens: detokenize keeping them
    splits_channels: ClassVar[bool] = False  # parses the whole output format, reasoning too (harmony.py):
    # used with calls off as well
    markers: ClassVar[tuple[str, ...]] = ()  # (the server keeps special tokens if a tokenizer makes one a
    # control token: some Hermes checkpoints mark <tool_call> special, and decode would drop it)
    keys: ClassVar[tuple[str, ...]] = ("arguments",)  # the arguments' key(s) of the streamed shape
    # grammar: text before the calls, between two calls, after them; the arguments' key written
    frame: ClassVar[tuple[str, str, str]] = ("", "", "")
    call_frame: ClassVar[tuple[str, str]] = ("", "")
    grammar_key: ClassVar[str] = "arguments"

    def __init__(self) -> None:
        self._buf = ""
        self._held = ""
        self._state = "start"
        self._call: CallText | None = None
        self._num_calls = 0
        self._content: list[str] = []
        self._deltas: list[ToolCallDelta] = []

    @classmethod
    def for_output(cls, prompt_tail: str, calls: bool) -> ToolParser:
        """A parser for one choice's output after a prompt ending in `prompt_tail`; `calls` False (only for
        `splits_channels` parsers): tool calls are not parsed."""
        return cls()

    @property
    def num_calls(self) -> int:
        """Calls begun so far (their first delta sent); finish_reason is "tool_calls" iff > 0."""
        return self._num_calls

    def feed(self, text: str) -> ParsedDelta:
        """The next piece of output."""
        self._buf += text
        while self._step(False):
            pass
        return self._take()

    def finish(self) -> ParsedDelta:
        """End of output: resolve and flush everything held back."""
        while self._step(True):
            pass
        self._emit(self._held + self._buf)  # every state resolves at the end; a guard, never expected
        self._held = self._buf = ""
        return self._take()

    def _step(self, final: bool) -> bool:
        raise NotImplementedError

    # ---- helpers for the state machines

    def _emit(self, text: str) -> None:
        if text:
            self._content.append(text)

    def _take(self) -> ParsedDelta:
        out = ParsedDelta("".join(self._content), _squash(self._deltas))
        self._content, self._deltas = [], []
        return out

    def _skip_ws(self, keep: bool) -> None:
        """Move the buffer's leading whitespace into `held` (keep) or drop it."""
        stripped = self._buf.lstrip(WS)
        if keep:
            self._held += self._buf[: len(self._buf) - len(stripped)]
        self._buf = stripped

    def _content_until(self, marker: str, final: bool) -> bool:
        """Content up to `marker` (consumed into `held`: True) or, without it, all that cannot become it."""
        k = self._buf.find(marker)
        if k >= 0:
            self._emit(self._buf[:k])
            self._held, self._buf = marker, self._buf[k + len(marker) :]
            return True
        keep = 0 if final else held_prefix(self._buf, marker)
        self._emit(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _begin_call(self, name: str | None = None) -> None:
        self._call = CallText(self._num_calls, self.keys, name)
        self._state = "call"

    def _drive_call(self, final: bool) -> str:
        """Advance the current call: "done" (buffer now past it), "bad" (held text emitted as content, the
        call's text left in the buffer) or "more"."""
        call = self._call
        assert call is not None
        was_sent = call.is_sent
        self._deltas.extend(call.advance(self._buf))
        if final:
            call.close(self._buf)
        if call.is_sent and not was_sent:
            self._num_calls += 1
        if call.state == "done":
            self._buf, self._held, self._call = self._buf[call.end :], "", None
            return "done"
        if call.state == "bad":
            self._emit(self._held)
            self._held, self._call = "", None
            return "bad"
        return "more"

    def _after_calls(self, markers: Sequence[str], final: bool) -> str | None:
        """After a call: drop whitespace; the marker the buffer starts with, "" to wait, None for text."""
        self._skip_ws(keep=False)
        for m in markers:
            if self._buf.startswith(m):
                self._buf = self._buf[len(m) :]
                return m
        if not self._buf or (not final and any(m.startswith(self._buf) for m in markers)):
            return ""
        return None

    # ---- grammar

    @classmethod
    def grammar(
        cls,
        tools: Sequence[Mapping[str, Any]],
        name: str | None,
        parallel: bool,
        control_ids: Mapping[str, int] | None = None,
    ) -> str:
        """A Lark grammar (llguidance's dialect) forcing the output to be >= 1 call (exactly 1 unless
        `parallel`) in this parser's format to one of `tools` (OpenAI tool dicts), or to `name` only.
        `control_ids`: the markers that are control tokens in the model's tokenizer, by text — written as
        that token (`<[id]>`), the way the model learned them, instead of as text.
        BlazrError on an empty or malformed tool list or a `name` not among the tools."""
        return call_grammar(cls, tools, name, parallel, control_ids)
