"""GPT-OSS's harmony chat format: its output split into reasoning, content and tool calls; the grammars that
hold it (a forced call, a response format) in harmony framing; the conversation as its chat template wants it.

Harmony (OpenAI's format for gpt-oss) writes a turn as messages, each `header<|message|>body`, the header
naming a channel and maybe a recipient; the prompt ends with `<|start|>assistant`, so the output opens with
the first message's header:

  <|channel|>analysis<|message|>Need the weather.<|end|>
  <|start|>assistant<|channel|>final<|message|>It is sunny.                                  (<|return|>)
or, a call (then <|call|>):
  <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}

(the recipient may also stand in the role header, ` to=functions.f<|channel|>commentary json<|message|>`, as
the template renders past calls). `<|return|>` and `<|call|>` end the turn: they are stop tokens
(tokenizer.py) and never reach the parser; `<|end|>` ends one message and is not a stop token here.

Routing (`HarmonyParser`): a message to `functions.NAME` is a tool call — its id and name are sent once the
header is complete, then its body streams as the arguments, the model's own text; `analysis` (and calls to
built-in tools, `python`, `browser.*`) is reasoning; `final`, a `commentary` preamble and any other channel
are content; text that starts no header (a model that ignores the format) is content. Messages of one kind
after the first are joined with a blank line. With calls off (no tools, tool_choice none) a call's body is
content. Headers and every marker are dropped; a suffix that may still become a marker is held back, so
none leaks into the content however the stream is cut; a header the output ends inside is dropped, one that
runs past `MAX_HEADER` characters without `<|message|>` was not a header and is content. A prompt that
ends inside a message (a prefill: `<|channel|>final<|message|>Sure,`) starts the output in that message's
body; a stray `<|message|>` or `<|constrain|>` inside a body is dropped. Untrusted output never raises; a
call's arguments are not checked (the server's job, as elsewhere).

Grammars: a forced call (tool_choice required or named) is `analysis? call` — an optional analysis message
(free text up to `<|end|>`, then `<|start|>assistant`), then `<|channel|>commentary to=functions.NAME
<|constrain|>json<|message|>` + the arguments' JSON, then a stop token ends the turn (`<|call|>`, or
`<|return|>`: the engine offers the stop ids once a grammar is done, and a grammar that held one back itself
would find it masked). One call per turn (`<|call|>` ends it), so parallel_tool_calls changes nothing. A
response format holds in the final channel after the same optional analysis (`answer_block`, through
engine/grammar.py's `ThinkFirst.lark`). Markers that are control tokens are written as those tokens.

Rendering (`template_messages`): the template reads an assistant's reasoning as `thinking` (blazr's
messages carry `reasoning_content`), renders one call per assistant message and names each tool result
after the call before it: several calls in one message become one message each, each followed by its
result (matched by tool_call_id); a tool without a description gets an empty one (`template_tools`).
`reasoning_effort` is one of low / medium / high (`template_effort`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from blazr.engine.json_schema import lark_json
from blazr.server.tool_call_text import WS, ToolCallDelta, new_call_id
from blazr.server.tool_grammar import chosen, lark_frame, tool_parameters
from blazr.server.tool_parser_base import ParsedDelta, ToolParser, held_prefix

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
THINK_START, THINK_END = CHANNEL + "analysis" + MESSAGE, END  # the analysis message, for thinking budgets
FINAL = CHANNEL + "final" + MESSAGE  # the final message's header (a prefill is written in it)
MAX_HEADER = 512  # characters a header may take before `<|message|>`

_OPENERS = (START, CHANNEL, "to=", CONSTRAIN)  # what a header may start with
_CONSUMED = (END, CALL, RETURN)  # a body ends at these (dropped) or where a header starts (START, CHANNEL)
_STRAY = (MESSAGE, CONSTRAIN)  # dropped inside a body
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z0-9_-]+)")
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}
EFFORTS |= {"xhigh": "high", "max": "high"}


def _route(header: str, calls: bool) -> tuple[str, str | None]:
    """(kind, function name) of a message by its header: "call", "reasoning" or "content"."""
    m = _RECIPIENT.search(header)
    recipient = m.group(1) if m else None
    if recipient is not None and recipient.startswith("functions.") and len(recipient) > len("functions."):
        return ("call", recipient[len("functions.") :]) if calls else ("content", None)
    c = _CHANNEL.search(header)
    channel = c.group(1) if c else None
    if channel == "analysis" or recipient not in (None, "assistant"):
        return "reasoning", None
    return "content", None


class HarmonyParser(ToolParser):
    """The harmony output parser (see the module docstring). Beside content and calls its deltas carry
    reasoning: it is the whole format's splitter, used with tools or without (`splits_channels`)."""

    name = "harmony"
    needs_special_tokens = True
    splits_channels = True
    markers = MARKERS

    def __init__(self, calls: bool = True, prompt_tail: str = "") -> None:
        super().__init__()
        self._calls = calls
        self._kind = "content"  # the current body's kind
        self._reasoning: list[str] = []
        self._seen: set[str] = set()  # kinds that had text (the next message of that kind gets a separator)
        self._fresh = False  # the current body has had no text yet
        self._state = "boundary"
        header, sep, after = prompt_tail[max(prompt_tail.rfind(START), 0) :].rpartition(MESSAGE)
        if sep and not any(m in after for m in MARKERS):  # the prompt ends inside a message's body
            self._open_body(header.rpartition(END)[2])

    @classmethod
    def for_output(cls, prompt_tail: str, calls: bool) -> HarmonyParser:
        return cls(calls, prompt_tail)

    def finish(self) -> ParsedDelta:
        while self._step(True):
            pass
        return self._take()

    def _take(self) -> ParsedDelta:
        out = dataclasses.replace(super()._take(), reasoning="".join(self._reasoning))
        self._reasoning = []
        return out

    def _step(self, final: bool) -> bool:
        if self._state == "boundary":
            return self._boundary(final)
        if self._state == "header":
            return self._header(final)
        return self._body(final)

    def _boundary(self, final: bool) -> bool:
        """A message starts: its header, or (no opener) text without channels — content."""
        rest = self._buf.lstrip(WS)
        if rest.startswith(_OPENERS):
            self._buf, self._state = rest, "header"
            return True
        if not rest or (not final and any(o.startswith(rest) for o in _OPENERS)):
            if final:
                self._buf = ""  # whitespace between messages
            return False
        self._kind, self._fresh, self._state = "content", False, "body"  # (no separator: it is not a message)
        return True

    def _header(self, final: bool) -> bool:
        buf = self._buf
        k = buf.find(MESSAGE)
        cut = min((i for i in (buf.find(m) for m in _CONSUMED) if i >= 0), default=-1)
        if k >= 0 and (cut < 0 or k < cut):
            self._buf = buf[k + len(MESSAGE) :]
            self._open_body(buf[:k])
            return True
        if cut >= 0:  # a header cut short by a message end: dropped with it
            end = next(m for m in _CONSUMED if buf.startswith(m, cut))
            self._buf, self._state = buf[cut + len(end) :], "boundary"
            return True
        if len(buf) > MAX_HEADER:  # not a header after all: content, its opener too (not read again)
            opener = next(o for o in _OPENERS if buf.startswith(o))
            self._kind, self._fresh, self._state = "content", False, "body"
            self._emit(opener)
            self._buf = buf[len(opener) :]
            return True
        if final:
            self._buf = ""
        return False

    def _open_body(self, header: str) -> None:
        kind, fn = _route(header, self._calls)
        self._kind, self._fresh, self._state = kind, True, "body"
        if kind == "call":
            self._deltas.append(ToolCallDelta(self._num_calls, new_call_id(), fn))
            self._num_calls += 1

    def _body(self, final: bool) -> bool:
        buf = self._buf
        hits = [(i, m) for m in MARKERS if (i := buf.find(m)) >= 0]
        if hits:
            k, marker = min(hits)
            self._text(buf[:k])
            if marker in _STRAY:  # (a stray marker inside a body: dropped)
                self._buf = buf[k + len(marker) :]
                return True
            rest = buf[k + len(marker) :] if marker in _CONSUMED else buf[k:]
            self._buf, self._state = rest, "boundary"
            return True
        keep = 0 if final else max(held_prefix(buf, m) for m in MARKERS)
        self._text(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return False

    def _text(self, text: str) -> None:
        """Body text of the current message, to where its kind goes."""
        kind = self._kind
        if kind == "call":
            if self._fresh:
                text = text.lstrip(WS)
            if text:
                self._deltas.append(ToolCallDelta(self._num_calls - 1, arguments=text))
                self._fresh = False
            return
        if not text:
            return
        if self._fresh and kind in self._seen:
            text = "\n\n" + text
        self._fresh = False
        self._seen.add(kind)
        (self._reasoning if kind == "reasoning" else self._content).append(text)

    # ---- grammar

    @classmethod
    def grammar(
        cls,
        tools: Sequence[Mapping[str, Any]],
        name: str | None,
        parallel: bool,
        control_ids: Mapping[str, int] | None = None,
    ) -> str:
        """The forced call in harmony (see the module docstring): an optional analysis message, then one call
        to one of `tools` (or to `name`), `parallel` notwithstanding (`<|call|>` ends the turn)."""
        schemas = chosen([tool_parameters(t) for t in tools], name)
        ids = dict(control_ids or {})
        lines = [
            "start: analysis? call",
            *_analysis_rules(ids),
            "call: " + lark_frame(CHANNEL + "commentary to=functions.", ids) + " fn",
            "fn: " + " | ".join(f"fn_{i}" for i in range(len(schemas))),
        ]
        args = lark_frame(" " + CONSTRAIN + "json" + MESSAGE, ids)
        for i, (f, params) in enumerate(schemas):
            for k in ("$schema", "$id"):
                params.pop(k, None)
            lines.append(f"fn_{i}: {json.dumps(f)} {args} {lark_json(params)}")
        return "\n".join(lines) + "\n"


def _analysis_rules(ids: Mapping[str, int]) -> list[str]:
    """Lark rules `analysis` (an analysis message, then the next message's `<|start|>assistant`) and
    `think` (its free text)."""
    return [
        "analysis: " + lark_frame(THINK_START, ids) + " think " + lark_frame(END + START + "assistant", ids),
        "think: /(.|\\n)*/",
    ]


def answer_block(control_ids: Mapping[str, int]) -> str:
    """The Lark that comes before a response format's answer: an optional analysis message, then the final
    channel's header (rules `analysis` and `think` included; engine/grammar.py's `ThinkFirst.lark`)."""
    rules = _analysis_rules(control_ids)
    return "analysis? " + lark_frame(FINAL, control_ids) + "\n" + "\n".join(rules)


# ------------------------------------------------------------------------------------------- render


def template_effort(effort: str | None) -> str | None:
    """A request's reasoning effort as harmony names it (low / medium / high); None stays None."""
    return None if effort is None else EFFORTS.get(effort, "medium")


def template_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools as GPT-OSS's template reads them: a function without a description gets an empty one (the
    template concatenates it unguarded)."""
    out = []
    for t in tools:
        fn = t.get("function")
        if isinstance(fn, Mapping) and fn.get("description") is None:
            t = {**t, "function": {**fn, "description": ""}}
        out.append(dict(t))
    return out


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as GPT-OSS's template reads them (see the module docstring)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = dict(messages[i])
        i += 1
        if m.get("role") != "assistant":
            out.append(m)
            continue
        reasoning = m.pop("reasoning_content", None)
        calls = m.pop("tool_calls", None) or []
        if reasoning is not None:
            m["thinking"] = reasoning
        if not calls:
            if m.get("content") is None:
                m["content"] = ""
            out.append(m)
            continue
        content = m.pop("content", None)
        if content and "thinking" not in m:  # a preamble before the calls: their analysis
            m["thinking"] = content
        results = []  # the tool results right after this message
        while i < len(messages) and messages[i].get("role") == "tool":
            results.append(dict(messages[i]))
            i += 1
        by_id = {r.get("tool_call_id"): k for k, r in enumerate(results)}
        used: set[int] = set()
        for j, call in enumerate(calls):
            one = m if j == 0 else {k: v for k, v in m.items() if k != "thinking"}
            out.append({**one, "tool_calls": [call]})
            k = by_id.get(call.get("id"), j)
            if k < len(results) and k not in used:  # its result (by id, else by position)
                used.add(k)
                out.append(results[k])
        out.extend(r for k, r in enumerate(results) if k not in used)
    return out
