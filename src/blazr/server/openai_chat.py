"""POST /v1/chat/completions: OpenAI's chat request translated into a `Conversation` (conversation.py), run
through the served model's chat format (chat_format.py, chat_run.py), answered as one JSON body or as
Server-Sent Events (`data: {chunk}\\n\\n` … `data: [DONE]\\n\\n`).

Streamed: the role first (as OpenAI sends it), then one write per engine step's worth of outputs; reasoning
(`reasoning_content` and `reasoning`, the same text) and tool-call pieces get their own delta fields. The
role chunks go out with the engine's first outputs, as vLLM sends them: a client timing its first chunk
then measures the prefill, and with continuous usage their usage holds the prompt's cached tokens, known
only once the engine has scheduled the prompt. vLLM's `prompt_logprobs` come on those first chunks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from blazr.server import chunks, constraints, request_in, response_out
from blazr.server.assistant import AssistantDelta
from blazr.server.chat_run import ChatRun, ChoiceResult
from blazr.server.chunks import ChunkEncoder, usage_mode
from blazr.server.conversation import Conversation, ToolChoice
from blazr.server.errors import bad_request
from blazr.server.middleware import request_id
from blazr.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCallOut,
    NamedToolChoice,
    ToolCallOut,
    Usage,
)
from blazr.server.serving import Serving
from blazr.server.transport import run_until_disconnect, sse_response

log = logging.getLogger("blazr.server")


def conversation(req: ChatCompletionRequest) -> Conversation:
    """The request's conversation: messages checked and in the template's conventions, tools, tool_choice,
    the response format, thinking."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    choice = req.tool_choice
    if not tools and choice not in (None, "none"):
        raise bad_request("tool_choice needs tools", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        tool_choice = ToolChoice("required", choice.function.name)
    else:
        tool_choice = ToolChoice(choice or "auto")
    structured = constraints.structured_output(req)
    return Conversation(
        messages=request_in.chat_messages(req),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=structured[0] if structured else None,
        thinking_budget=req.thinking_token_budget,
        reasoning_effort=req.reasoning_effort,
        template_kwargs=dict(req.chat_template_kwargs or {}),
        add_generation_prompt=req.add_generation_prompt,
        params={"tool_name": "tool_choice.function.name", "format": structured[1] if structured else ""},
    )


async def chat(s: Serving, req: ChatCompletionRequest, raw: Request) -> Response:
    model = s.check_model(req.model)
    rid = request_id(raw.scope)
    request_in.check_unsupported(req)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens == 0:
        raise bad_request("max_tokens must be at least 1", "max_tokens")
    params = request_in.sampling_params(
        req,
        max_tokens=max_tokens or s.engine.max_model_len,  # set by start_chat when absent
        vocab_size=s.engine.vocab_size,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        prompt_logprobs=req.prompt_logprobs,
    )
    conv = await s.off_loop(conversation, req)
    job_id = f"chatcmpl-{rid}"
    _log_request(job_id, req.user, req.safety_identifier)
    run = await s.start_chat(conv, params, job_id, max_tokens)
    job = ChatJob(s, run, req, model)
    if req.stream:
        return sse_response(job.events(), run.stream, rid)
    return await run_until_disconnect(raw, job.collect(), rid)


class ChatJob:
    """One chat completion's answer, from its `ChatRun`: a body or SSE events."""

    def __init__(self, s: Serving, run: ChatRun, req: ChatCompletionRequest, model: str) -> None:
        self.tok = s.tokenizer
        self.run = run
        self.req = req
        self.model = model
        self.id = run.id
        self.created = int(time.time())

    def usage(self) -> Usage:
        return chunks.usage(self.run.num_prompt_tokens, self.run.num_generated, self.run.num_cached)

    def _logprobs(self, lps: list) -> ChatLogprobs | None:
        if not self.req.logprobs:
            return None
        return response_out.chat_logprobs(lps, self.tok, self.req.return_tokens_as_token_ids)

    def _prompt_logprobs(self) -> list | None:
        if self.req.prompt_logprobs is None:
            return None
        return response_out.prompt_logprobs(self.run.prompt_logprobs, self.tok)

    async def collect(self) -> ChatCompletionResponse:
        results = await self.run.results()
        choices = [
            ChatChoice(
                index=r.index,
                message=_message(r),
                logprobs=self._logprobs(r.logprobs),
                finish_reason=r.finish_reason,  # type: ignore[arg-type]
            )
            for r in results
        ]
        return ChatCompletionResponse(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=self.usage(),
            prompt_logprobs=self._prompt_logprobs(),
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _roles(self, enc: ChunkEncoder, usage: Usage | None) -> bytes:
        """Every choice's first chunk: the role, empty content (and the prompt's logprobs if asked)."""
        delta = DeltaMessage(role="assistant", content="")
        extra = {"prompt_logprobs": self._prompt_logprobs()} if self.req.prompt_logprobs is not None else None
        return b"".join(
            enc.event(self._chunk([ChatChunkChoice(index=i, delta=delta)], usage), extra)
            for i in range(self.req.n)
        )

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE events (see the module docstring)."""
        mode = usage_mode(self.req.stream_options)
        enc = ChunkEncoder(ChatCompletionChunk, self.id, self.created, self.model, mode)
        run = self.run
        num_tokens = [0] * self.req.n
        is_role_sent = False
        async for steps in run.steps():
            parts: list[bytes] = []
            if not is_role_sent:
                is_role_sent = True
                role_usage = (
                    chunks.usage(run.num_prompt_tokens, 0, run.num_cached) if mode == "continuous" else None
                )
                parts.append(self._roles(enc, role_usage))
            for step in steps:
                num_tokens[step.index] += step.num_tokens
                delta = step.delta
                lps = self._logprobs(step.logprobs) if step.logprobs else None
                if not (delta or lps or step.finished):
                    continue
                so_far = None
                if mode == "continuous":
                    so_far = chunks.usage(run.num_prompt_tokens, num_tokens[step.index], run.num_cached)
                if lps is None and not step.finished and not (delta.reasoning or delta.tool_calls):
                    parts.append(enc.text(step.index, delta.content, so_far))
                    continue
                choice = ChatChunkChoice(
                    index=step.index, delta=_delta(delta), logprobs=lps, finish_reason=step.finish_reason
                )  # type: ignore[arg-type]
                parts.append(enc.event(self._chunk([choice], so_far)))
            if parts:
                yield b"".join(parts)
        if mode != "off":
            yield enc.event(self._chunk([], self.usage()))


def _message(r: ChoiceResult) -> AssistantMessage:
    """A choice's whole message: content null beside tool calls or reasoning when empty."""
    calls = [
        ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments))
        for c in r.tool_calls
    ]
    content = r.content
    if calls and not content.strip():
        content = ""
    reasoning = r.reasoning or None
    return AssistantMessage(
        content=content or (None if calls or reasoning else ""),
        reasoning_content=reasoning,
        reasoning=reasoning,
        tool_calls=calls or None,
    )


def _delta(d: AssistantDelta) -> DeltaMessage:
    calls = [
        DeltaToolCall(
            index=c.index,
            id=c.id,
            type="function" if c.id is not None else None,
            function=DeltaFunctionCall(name=c.name, arguments=c.arguments or ("" if c.name else None)),
        )
        for c in d.tool_calls
    ]
    reasoning = d.reasoning or None
    return DeltaMessage(
        content=d.content or None, reasoning_content=reasoning, reasoning=reasoning, tool_calls=calls or None
    )


def _log_request(job_id: str, user: str | None, safety_id: str | None) -> None:
    if log.isEnabledFor(logging.INFO):
        labels = "".join(f" {k}={v!r}" for k, v in (("user", user), ("safety_identifier", safety_id)) if v)
        log.info("%s: 1 prompt(s)%s", job_id, labels)
