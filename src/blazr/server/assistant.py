"""One chat choice's output text split into what the assistant message holds: reasoning, content, tool calls.

In:  the choice's text, piece by piece as the engine detokenizes it (a piece may cut a marker anywhere).
Out: `AssistantDelta`s — reasoning text (`reasoning_content`), content text, tool-call pieces — and at the
     end the finish reason the client sees.

The text goes through the reasoning parser first (`<think>…</think>`, server/reasoning.py, with
--reasoning-parser), and what it leaves as content through the tool-call parser (server/tool_parsers.py, when
the request has tools and tool_choice is not "none"); a `<tool_call>` inside the reasoning is thinking, not
a call. Either parser may be absent. A tool parser of the whole format (harmony: `splits_channels`) is
there without tools too, and splits the reasoning itself.

One code path: a non-streaming answer is this object fed the whole text as the last piece, so the pieces of
a streamed answer always reassemble to the non-streamed message.
"""

from __future__ import annotations

from dataclasses import dataclass

from blazr.server.reasoning import ReasoningParser
from blazr.server.tool_call_text import ToolCallDelta
from blazr.server.tool_parsers import ParsedDelta, ToolParser


@dataclass(frozen=True)
class AssistantDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class AssistantOutput:
    """The parsers of one choice. `forced_name`: tool_choice named a function (OpenAI then reports
    finish_reason "stop", not "tool_calls"). `max_calls`: 1 with parallel_tool_calls false — calls after the
    first are dropped (a grammar already prevents them when the call is forced; with "auto" the output
    is free, so they are cut here)."""

    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        forced_name: str | None = None,
        max_calls: int | None = None,
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.forced_name = forced_name
        self.max_calls = max_calls

    @property
    def is_plain(self) -> bool:
        """No parser: every piece is content as it comes."""
        return self.reasoning is None and self.tools is None

    def feed(self, text: str, last: bool = False) -> AssistantDelta:
        """The next piece of the output; `last`: the output ends with it, so what the parsers held back
        (a cut marker, an unclosed call) comes out too."""
        if self.is_plain:
            return AssistantDelta(content=text)
        reasoning, content = "", text
        if self.reasoning is not None:
            r = self.reasoning.feed(text)
            reasoning, content = r.reasoning, r.content
            if last:
                end = self.reasoning.finish()
                reasoning, content = reasoning + end.reasoning, content + end.content
        if self.tools is None:
            return AssistantDelta(reasoning, content)
        d = self.tools.feed(content) if content else ParsedDelta()
        calls, content, reasoning = d.tool_calls, d.content, reasoning + d.reasoning
        if last:
            end_calls = self.tools.finish()
            calls, content = calls + end_calls.tool_calls, content + end_calls.content
            reasoning += end_calls.reasoning
        if self.max_calls is not None:
            calls = tuple(c for c in calls if c.index < self.max_calls)
        return AssistantDelta(reasoning, content, calls)

    @property
    def num_calls(self) -> int:
        num = self.tools.num_calls if self.tools is not None else 0
        return num if self.max_calls is None else min(num, self.max_calls)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """ "tool_calls" when the model called tools and stopped by itself (not at the length limit)."""
        if engine_reason == "stop" and self.num_calls and self.forced_name is None:
            return "tool_calls"
        return engine_reason
