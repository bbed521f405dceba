"""One chat request through the engine, API-neutral: what every chat front-end reads its answer from.

In:  a `ChatPlan` (chat_format.py) already applied to its `SamplingParams`, and the engine's stream of the
     request's outputs (n choices, interleaved).
Out: `ChatRun.steps()` — per engine step, each choice's `ChoiceStep`: its `AssistantDelta` (reasoning,
     content, tool-call pieces, through the plan's parsers), logprobs, tokens, and once finished its finish
     reason (`stop`, `length`, `tool_calls`) and the stop string that ended it, if one did; or
     `ChatRun.results()` — every choice whole (`ChoiceResult`, the same parsers fed the same text, so a
     streamed answer always reassembles to the whole one). Usage: prompt tokens, the part of them served
     from the prefix cache, tokens generated; vLLM's prompt logprobs when asked.

Stop strings: the engine is asked to keep a matched stop string in the text, and it is cut here (the
engine hands the whole match out in the last piece, engine/detokenizer.py), so a front-end can report which
one matched (Anthropic's `stop_sequence`) — unless the client asked to keep it itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from blazr.engine.async_engine import RequestStream
from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import TokenLogprob
from blazr.server.assistant import AssistantDelta, AssistantOutput
from blazr.server.chat_format import ChatPlan
from blazr.server.tool_parsers import ParsedDelta, ToolCall, merge_deltas


@dataclass
class ChoiceStep:
    """What one choice produced in one engine step."""

    index: int
    delta: AssistantDelta
    logprobs: list[TokenLogprob]
    num_tokens: int
    finished: bool = False
    finish_reason: str | None = None  # stop | length | tool_calls, once finished
    stop_sequence: str | None = None  # the stop string that ended it


@dataclass
class ChoiceResult:
    """One choice whole: reasoning, content, tool calls (their arguments JSON text), how it ended."""

    index: int
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    stop_sequence: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_tokens: int = 0


def prepare_stops(params: SamplingParams) -> bool:
    """Ask the engine to keep matched stop strings in the text (this module cuts them): True when it will."""
    if params.stop and not params.include_stop_str_in_output:
        params.include_stop_str_in_output = True
        return True
    return False


class ChatRun:
    """The outputs of one submitted chat request (see the module docstring)."""

    def __init__(
        self, plan: ChatPlan, params: SamplingParams, request_id: str, stream: RequestStream, cut_stops: bool
    ) -> None:
        self.plan = plan
        self.params = params
        self.id = request_id
        self.stream = stream
        self.cut_stops = cut_stops
        self.num_prompt_tokens = len(plan.prompt_ids)
        self.num_cached = 0
        self.num_generated = 0
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.outputs: list[AssistantOutput] = [plan.output() for _ in range(params.n)]
        self.token_ids: list[list[int]] = [[] for _ in range(params.n)]  # each choice's tokens so far
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None  # when the prompt was done (its first token came)

    def _cut(self, out: SeqOutput) -> tuple[str, str | None]:
        """The output's text without a matched stop string, and that string."""
        text = out.text
        if self.cut_stops and out.finished and out.finish_reason == "stop":
            for s in sorted(self.params.stop, key=len, reverse=True):
                if text.endswith(s):
                    return text[: len(text) - len(s)], s
        return text, None

    def _note(self, out: SeqOutput) -> None:
        """What every output tells about the whole request."""
        self.num_cached = out.num_cached_tokens
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.token_ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.num_generated += len(out.token_ids)
        self.token_ids[out.index] += out.token_ids

    def _step(self, out: SeqOutput) -> ChoiceStep:
        self._note(out)
        text, stop = self._cut(out)
        output = self.outputs[out.index]
        delta = output.feed(text, last=out.finished)
        reason = output.finish_reason(out.finish_reason) if out.finished else None
        return ChoiceStep(out.index, delta, out.logprobs, len(out.token_ids), out.finished, reason, stop)

    async def steps(self) -> AsyncIterator[list[ChoiceStep]]:
        """Each engine step's outputs, parsed (the stream is aborted however the reader leaves)."""
        try:
            async for batch in self.stream.batches():
                yield [self._step(out) for out in batch]
        finally:
            self.stream.abort()

    async def results(self) -> list[ChoiceResult]:
        """Every choice whole: its text fed to its parsers at once, as the last piece."""
        texts: list[list[str]] = [[] for _ in self.outputs]
        results = [ChoiceResult(i) for i in range(len(self.outputs))]
        try:
            async for out in self.stream:
                self._note(out)
                r = results[out.index]
                text, r.stop_sequence = self._cut(out)
                texts[out.index].append(text)
                r.logprobs.extend(out.logprobs)
                r.num_tokens += len(out.token_ids)
                if out.finished:
                    r.finish_reason = out.finish_reason
        finally:
            self.stream.abort()
        for r, output, text in zip(results, self.outputs, texts, strict=True):
            whole = output.feed("".join(text), last=True)
            r.reasoning, r.content = whole.reasoning, whole.content
            r.tool_calls = merge_deltas([ParsedDelta(tool_calls=whole.tool_calls)])[1]
            r.finish_reason = output.finish_reason(r.finish_reason)
        return results
