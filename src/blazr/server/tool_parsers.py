"""Tool calls in model output: incremental parsers that split detokenized text into content and OpenAI tool
calls.

In:  the output text in pieces (detokenized deltas; a piece may cut a marker or a JSON string anywhere).
Out: `ParsedDelta` per piece (content text and `ToolCallDelta`s); `finish()` flushes what was held back.
     Non-streaming is the same parser fed the whole text then `finish()` (`parse_tool_calls`), so streamed
     deltas always reassemble (`merge_deltas`) to exactly the non-streamed answer.

Formats (`TOOL_PARSERS`; `detect_tool_parser` picks one from a chat template's text):
  hermes       `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, several in a row
               (Hermes, Qwen2.5/Qwen3, blazr's fallback); a call the output ends in without `</tool_call>`
               still counts.
  llama3_json  the whole output is `{"name": "f", "parameters": {...}}` ("arguments" accepted too), maybe
               after `<|python_tag|>`, several separated by `;`; only when the output starts (after
               whitespace and the tag) with `{`, otherwise it is all content.
  mistral      `[TOOL_CALLS]` then a JSON array of calls (v3 tokenizers) or `f[ARGS]{...}` per call (newer
               ones, `f[CALL_ID]id[ARGS]{...}` accepted); its markers are control tokens
               (`needs_special_tokens`).
  harmony      GPT-OSS: `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}`, one per
               turn; the parser splits the whole harmony output — reasoning, content, calls — (harmony.py).

Streaming: content streams as soon as it cannot be the start of a marker (only a suffix that is a proper
prefix of the start marker is held back). A call's first delta carries its id and whole name, sent once the
arguments' opening `{` is seen; the arguments then stream as the model's own text of the value, up to and
including its closing `}` (an incremental scan of brackets and strings knows where the value ends, so
nothing after it — the outer `}`, whitespace, `</tool_call>` — is ever sent). A call written in another shape
(keys in another order, "parameters" in hermes, extra keys first, arguments as a JSON string, OpenAI's
`{"function": {...}}` wrapper) is held until its object closes, then sent whole: name and
`json.dumps(arguments, ensure_ascii=False)` in one delta.

Framing: markers are dropped; whitespace after a call (before the next call, text, or the end) is dropped;
text before, between and after calls is content. Whitespace before the first call is content (it streamed
before the call was known): `parse_tool_calls` gives content None when it is only whitespace.

Untrusted output never raises. A call that turns out malformed (no `{` after the marker, not JSON, no name,
arguments not an object, the output ended inside it) while nothing of it was sent becomes content, its marker
included, as the model wrote it. Once its name was sent a call stands: if the arguments then break (a
character JSON cannot have there, or the output ends inside them) the call keeps the arguments sent so far,
which may then not parse, and the text from the break on is content. Arguments are not validated against the
tool's schema, nor names against the request's tools (the server's job).

Grammars (`ToolParser.grammar`, built in tool_grammar.py) force a model to write calls in the parser's
format. The JSON scanning of one call as it grows is tool_call_text.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from blazr.server.harmony import HarmonyParser
from blazr.server.tool_parser_base import ParsedDelta, ToolCall, ToolParser

__all__ = ["TOOL_PARSERS", "ParsedDelta", "ToolCall", "ToolParser", "detect_tool_parser", "merge_deltas"]


class HermesToolParser(ToolParser):
    """`<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>` (Hermes, Qwen2.5/3, blazr's own)."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    markers = (start, end)
    frame = ("", "\n", "")
    call_frame = ("<tool_call>\n", "\n</tool_call>")

    def _step(self, final: bool) -> bool:
        if self._state in ("start", "content"):
            if self._content_until(self.start, final):
                self._state = "open"
                return True
            return False
        if self._state == "open":  # after <tool_call>: whitespace, then the call's `{`
            self._skip_ws(keep=True)
            if not self._buf:
                if final:
                    self._emit(self._held)
                    self._held = ""
                return False
            if self._buf[0] == "{":
                self._begin_call()
            else:
                self._emit(self._held)
                self._held, self._state = "", "content"
            return True
        if self._state == "call":
            status = self._drive_call(final)
            if status != "more":
                self._state = "after" if status == "done" else "content"
            return status != "more"
        # after a call: its </tool_call>, the next <tool_call>, or text
        marker = self._after_calls((self.end, self.start), final)
        if marker == self.start:
            self._held, self._state = marker, "open"
        elif marker is None:
            self._state = "content"
        return marker != ""


class Llama3JsonToolParser(ToolParser):
    """The whole output is `{"name": "f", "parameters": {...}}` calls separated by `;` (Llama 3.1-3.3's
    JSON tool calling), maybe after `<|python_tag|>`; content if it does not start with `{`."""

    name = "llama3_json"
    keys = ("parameters", "arguments")
    python_tag = "<|python_tag|>"
    markers = (python_tag,)
    frame = ("", "; ", "")
    grammar_key = "parameters"

    def _step(self, final: bool) -> bool:
        if self._state in ("start", "next"):  # where a call may begin: whitespace (and the tag) first
            self._skip_ws(keep=True)
            if self._state == "start" and self._buf.startswith(self.python_tag):
                self._held += self.python_tag
                self._buf = self._buf[len(self.python_tag) :]
                return True
            if self._buf.startswith("{"):
                self._begin_call()
                return True
            waiting = not self._buf or (self._state == "start" and self.python_tag.startswith(self._buf))
            if waiting and not final:
                return False
            if self._state == "next" and not self._buf:  # a trailing separator: dropped
                self._held = ""
                return False
            self._state = "text"
            self._emit(self._held)
            self._held = ""
            return True
        if self._state == "call":
            status = self._drive_call(final)
            if status != "more":
                self._state = "sep" if status == "done" else "text"
            return status != "more"
        if self._state == "sep":
            marker = self._after_calls((";", "{"), final)
            if marker == ";":
                self._held, self._state = ";", "next"
            elif marker == "{":
                self._buf = "{" + self._buf
                self._state = "next"
            elif marker is None:
                self._state = "text"
            return marker != ""
        self._emit(self._buf)  # text: not tool calls
        self._buf = ""
        return False


class MistralToolParser(ToolParser):
    """`[TOOL_CALLS]` + a JSON array of calls (v3 tokenizers), or `[TOOL_CALLS]f[ARGS]{...}` per call
    (newer ones; `f[CALL_ID]id[ARGS]{...}` too). The markers are control tokens."""

    name = "mistral"
    needs_special_tokens = True
    start = "[TOOL_CALLS]"
    markers = (start, "[ARGS]", "[CALL_ID]")
    frame = ("[TOOL_CALLS][", ", ", "]")
    name_run = re.compile(r"[A-Za-z0-9_.\-]*")
    _call_name = ""  # the function name read before [ARGS]

    def _step(self, final: bool) -> bool:
        state = self._state
        if state in ("start", "content"):
            if self._content_until(self.start, final):
                self._state = "open"
                return True
            return False
        if state in ("open", "array", "args_open"):
            self._skip_ws(keep=True)
            if not self._buf:
                if final:
                    self._emit(self._held)
                    self._held = ""
                return False
            c = self._buf[0]
            if state == "open":
                self._state = "array" if c == "[" else "name"
                if c == "[":
                    self._held += "["
                    self._buf = self._buf[1:]
            elif c == "{":
                self._begin_call(self._call_name if state == "args_open" else None)
                self._state = "call" if state == "args_open" else "element"
            else:
                self._emit(self._held)
                self._held, self._state = "", "content"
            return True
        if state == "name":
            return self._name(final)
        if state in ("call", "element"):
            status = self._drive_call(final)
            if status != "more":
                self._state = "content" if status == "bad" else "after" if state == "call" else "array_sep"
            return status != "more"
        if state == "array_sep":
            marker = self._after_calls((",", "]"), final)
            if marker == ",":
                self._state = "array_more"
            elif marker == "]":
                self._state = "after"
            elif marker is None:
                self._state = "content"
            return marker != ""
        if state == "array_more":  # after a comma: the next call, or `]` (a trailing comma)
            marker = self._after_calls(("]",), final)
            if marker == "]":
                self._state = "after"
            elif marker is None and self._buf[0] == "{":
                self._begin_call()
                self._state = "element"
            elif marker is None:
                self._state = "content"
            return marker != ""
        marker = self._after_calls((self.start,), final)  # after
        if marker == self.start:
            self._held, self._state = marker, "open"
        elif marker is None:
            self._state = "content"
        return marker != ""

    def _name(self, final: bool) -> bool:
        """`f[ARGS]` or `f[CALL_ID]id[ARGS]`: the name then the arguments' `{`; anything else is content."""
        buf = self._buf
        i = self.name_run.match(buf).end()  # type: ignore[union-attr]
        name, rest = buf[:i], buf[i:]
        if rest.startswith("[CALL_ID]"):
            j = i + len("[CALL_ID]")
            j = self.name_run.match(buf, j).end()  # type: ignore[union-attr]
            rest = buf[j:]
            may = "[ARGS]".startswith(rest)
        else:
            j = i
            may = "[ARGS]".startswith(rest) or "[CALL_ID]".startswith(rest)
        if name and rest.startswith("[ARGS]"):
            self._call_name = name
            self._held += buf[: j + len("[ARGS]")]
            self._buf = buf[j + len("[ARGS]") :]
            self._state = "args_open"
            return True
        if may and not final:
            return False
        self._emit(self._held)
        self._held, self._state = "", "content"
        return True


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, HarmonyParser)
}


def detect_tool_parser(template_source: str) -> str | None:
    """The tool parser a chat template's text calls for, or None."""
    if "<|channel|>" in template_source:
        return "harmony"
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or (
        "<|start_header_id|>" in template_source and "tools" in template_source
    ):
        return "llama3_json"
    return None


def merge_deltas(deltas: Iterable[ParsedDelta]) -> tuple[str, list[ToolCall]]:
    """Reassemble deltas: the whole content and the calls in index order (id and name from their first)."""
    content: list[str] = []
    calls: dict[int, list[Any]] = {}
    for d in deltas:
        content.append(d.content)
        for t in d.tool_calls:
            call = calls.setdefault(t.index, [None, None, []])
            call[0] = call[0] or t.id
            call[1] = call[1] or t.name
            call[2].append(t.arguments)
    merged = [ToolCall(c[0] or "", c[1] or "", "".join(c[2])) for _, c in sorted(calls.items())]
    return "".join(content), merged


def parse_tool_calls(parser: ToolParser, text: str) -> tuple[str | None, list[ToolCall]]:
    """Non-streaming: `text` fed whole to a fresh `parser`, then finished. Content is None when empty, or
    only whitespace beside calls."""
    content, calls = merge_deltas([parser.feed(text), parser.finish()])
    if not content or (calls and not content.strip()):
        return None, calls
    return content, calls
