"""Anthropic's Messages API — POST /v1/messages and /v1/messages/count_tokens — as a thin translation onto
the chat core: the request becomes a `Conversation` (conversation.py), the answer comes back from its
`ChatRun` (chat_run.py) as content blocks. Errors are Anthropic's shape (errors.py); the API key may come as
`x-api-key` (middleware.py); `anthropic-version` and `anthropic-beta` headers are accepted and change
nothing.

In: `system` (and system messages) become system messages; a user turn's `tool_result` blocks become tool
messages (before the turn's text), an assistant turn's `thinking` its `reasoning_content`, its `tool_use`
blocks its tool calls; consecutive text turns of one role are joined, as Anthropic combines them; a last
assistant turn of text is a prefill — the answer continues from it. `tool_choice` `any` is a forced call,
`tool` a forced call to that tool (both held by the format's grammar), `none` hides the tools;
`disable_parallel_tool_use` allows one call. `thinking` `enabled` caps the reasoning at `budget_tokens`,
`disabled` turns the template's switch off, `output_config.effort` maps to a budget (conversation.py);
`output_config.format` (or the beta `output_format`) holds the answer to a JSON schema.

Out: content blocks `thinking` (its `signature` empty: blazr signs nothing), `text`, `tool_use` (`input`
parsed from the call's arguments); `stop_reason` `end_turn`, `max_tokens`, `stop_sequence` (with the
`stop_sequence` that matched) or `tool_use`; usage with `input_tokens` (not read from the cache),
`cache_read_input_tokens` (served from the prefix cache) and `output_tokens`.

Streamed (Server-Sent Events): message_start (with the usage known so far) and a ping once the prompt is
scheduled, then per block content_block_start, its deltas (`thinking_delta`, `text_delta`,
`input_json_delta`), content_block_stop; then message_delta (stop reason, output tokens) and message_stop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from blazr.engine.grammar import StructuredOutput
from blazr.errors import BlazrError
from blazr.server import request_in
from blazr.server.assistant import AssistantDelta
from blazr.server.chat_run import ChatRun, ChoiceResult
from blazr.server.conversation import Conversation, ToolChoice
from blazr.server.errors import bad_request
from blazr.server.middleware import request_id
from blazr.server.schemas_anthropic import (
    MessagesRequest,
    PromptFields,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from blazr.server.serving import Serving
from blazr.server.tool_call_text import ToolCallDelta
from blazr.server.transport import run_until_disconnect, sse_response

log = logging.getLogger("blazr.server")

PARAMS = {
    "messages": "messages",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "tool_name": "tool_choice.name",
    "format": "output_config.format",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

# ----------------------------------------------------------------------------------------------- input


def conversation(req: PromptFields) -> Conversation:
    """The request's conversation (see the module docstring)."""
    messages = _messages(req)
    prefill = ""
    last = messages[-1]
    if last["role"] == "assistant" and not last.get("tool_calls") and isinstance(last.get("content"), str):
        prefill = messages.pop()["content"]
        if not messages:
            raise bad_request("messages: a conversation cannot be only an assistant turn", "messages")
    tools = []
    for t in req.tools or ():
        function = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            function["description"] = t.description
        tools.append({"type": "function", "function": function})
    choice, parallel = ToolChoice("auto"), True
    if req.tool_choice is not None:
        c = req.tool_choice
        if c.type == "tool" and c.name is None:
            raise bad_request("tool_choice of type tool needs a name", "tool_choice.name")
        mode = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}[c.type]
        choice = ToolChoice(mode, c.name if c.type == "tool" else None)  # type: ignore[arg-type]
        parallel = not c.disable_parallel_tool_use
    if choice.is_forced and not tools:
        raise bad_request(f"tool_choice {req.tool_choice.type!r} needs tools", "tool_choice")  # type: ignore[union-attr]
    thinking, budget = None, None
    if req.thinking is not None:
        kind = req.thinking.type
        thinking = {"enabled": True, "adaptive": True, "disabled": False}.get(kind)
        budget = req.thinking.budget_tokens if kind == "enabled" else None
        if kind == "enabled" and budget is None:
            raise bad_request("thinking of type enabled needs budget_tokens", "thinking.budget_tokens")
    effort = req.output_config.effort if req.output_config is not None else None
    return Conversation(
        messages=messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        response_format=_format(req),
        thinking=thinking,
        thinking_budget=budget,
        reasoning_effort=effort,
        prefill=prefill,
        params=PARAMS,
    )


def _format(req: PromptFields) -> StructuredOutput | None:
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is None:
        fmt = req.output_format
    if fmt is None:
        return None
    try:
        return StructuredOutput(json_schema=fmt.schema_, strict=True)
    except BlazrError as e:
        raise bad_request(str(e), "output_config.format") from None


def _messages(req: PromptFields) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n".join(b.text for b in req.system)
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id → tool name
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            _append(out, {"role": m.role, "content": m.content})
            continue
        texts, reasoning, calls, results = [], [], [], []
        for j, block in enumerate(m.content):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                if m.role != "assistant":
                    raise bad_request(f"{where}: {block.type} blocks belong to assistant turns", where)
                if isinstance(block, ThinkingBlock):
                    reasoning.append(block.thinking)
            elif isinstance(block, ToolUseBlock):
                if m.role != "assistant":
                    raise bad_request(f"{where}: tool_use blocks belong to assistant turns", where)
                names[block.id] = block.name
                function = {"name": block.name, "arguments": block.input}
                calls.append({"id": block.id, "type": "function", "function": function})
            elif isinstance(block, ToolResultBlock):
                if m.role != "user":
                    raise bad_request(f"{where}: tool_result blocks belong to user turns", where)
                results.append(_tool_message(block, names))
        if m.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
            if reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
            if calls:
                message["tool_calls"] = calls
            elif message["content"] is None:
                message["content"] = ""
            _append(out, message)
            continue
        out.extend(results)
        if texts or not results:
            _append(out, {"role": m.role, "content": "\n".join(texts)})
    return out


def _append(out: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Add a message; a text turn right after a text turn of the same role joins it."""
    last = out[-1] if out else None
    plain = set(message) == {"role", "content"} and isinstance(message["content"], str)
    if (
        plain
        and last is not None
        and last["role"] == message["role"] != "system"
        and set(last) == {"role", "content"}
        and isinstance(last["content"], str)
    ):
        last["content"] += "\n\n" + message["content"]
        return
    out.append(message)


def _tool_message(block: ToolResultBlock, names: dict[str, str]) -> dict[str, Any]:
    content = block.content
    text = content if isinstance(content, str) else "\n".join(b.text for b in content or ())
    if block.is_error:
        text = f"Error: {text}"
    message = {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}
    if block.tool_use_id in names:
        message["name"] = names[block.tool_use_id]
    return message


# -------------------------------------------------------------------------------------------- endpoints


async def create(s: Serving, req: MessagesRequest, raw: Request) -> Response:
    model = s.check_model(req.model)
    rid = request_id(raw.scope)
    if req.max_tokens == 0:
        raise bad_request("max_tokens must be at least 1 (blazr does not pre-warm the cache)", "max_tokens")
    params = request_in.basic_params(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=req.stop_sequences,
    )
    conv = await s.off_loop(conversation, req)
    job_id = f"msg_{rid}"
    if req.metadata is not None and req.metadata.user_id and log.isEnabledFor(logging.INFO):
        log.info("%s: user_id=%r", job_id, req.metadata.user_id)
    run = await s.start_chat(conv, params, job_id, req.max_tokens)
    job = MessageJob(run, model)
    if req.stream:
        return sse_response(job.events(), run.stream, rid, "anthropic")
    return await run_until_disconnect(raw, job.collect(), rid)


async def count_tokens(s: Serving, req: PromptFields) -> dict[str, Any]:
    """The input tokens /v1/messages would prefill for this request."""
    s.check_model(req.model)
    conv = await s.off_loop(conversation, req)
    s.check_prompt_chars(conv.num_chars(), "messages")
    ids = await s.off_loop(s.format.render, conv)
    return {"input_tokens": len(ids)}


# ---------------------------------------------------------------------------------------------- output


class MessageJob:
    """One message's answer, from its `ChatRun`: a body or SSE events."""

    def __init__(self, run: ChatRun, model: str) -> None:
        self.run = run
        self.model = model
        self.id = run.id

    def usage(self) -> dict[str, Any]:
        run = self.run
        return {
            "input_tokens": run.num_prompt_tokens - run.num_cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": run.num_cached,
            "output_tokens": run.num_generated,
        }

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, stop: str | None) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop,
            "usage": self.usage(),
        }

    async def collect(self) -> dict[str, Any]:
        r = (await self.run.results())[0]
        reason = _stop_reason(r.finish_reason, r.stop_sequence, bool(r.tool_calls))
        return self.message(_blocks(r), reason, r.stop_sequence)

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE events (see the module docstring)."""
        blocks = _BlockWriter()
        started = False
        reason, stop = None, None
        async for steps in self.run.steps():
            parts: list[bytes] = []
            if not started:
                started = True
                parts.append(_event("message_start", message=self.message([], None, None)))
                parts.append(_event("ping"))
            for step in steps:
                parts += blocks.feed(step.delta)
                if step.finished:
                    stop = step.stop_sequence
                    reason = _stop_reason(step.finish_reason, stop, blocks.num_calls > 0)
            if parts:
                yield b"".join(parts)
        end = blocks.close()
        end.append(
            _event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": stop},
                usage={"output_tokens": self.run.num_generated},
            )
        )
        end.append(_event("message_stop"))
        yield b"".join(end)


def _event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}, ensure_ascii=False).encode()
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _stop_reason(finish: str | None, stop: str | None, has_calls: bool) -> str | None:
    """Anthropic's stop reason: `tool_use` whenever the model called a tool and stopped by itself (a
    forced one too, unlike OpenAI's finish reason for a named function)."""
    if stop is not None:
        return "stop_sequence"
    if finish in ("stop", "tool_calls") and has_calls:
        return "tool_use"
    return STOP_REASONS.get(finish or "", "end_turn") if finish is not None else None


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object `tool_use.input` is ({} if they broke off)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _blocks(r: ChoiceResult) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append({"type": "thinking", "thinking": r.reasoning, "signature": ""})
    if r.content and not (r.tool_calls and not r.content.strip()):
        out.append({"type": "text", "text": r.content})
    for c in r.tool_calls:
        out.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)})
    return out


class _BlockWriter:
    """The content-block events of one streamed message: opens, grows and closes its blocks."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block growing now
        self.held = ""  # text whitespace not sent yet (it may only sit beside tool calls)
        self.num_calls = 0

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return [*out, _event("content_block_start", index=self.index, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", index=self.index, delta=delta)

    def feed(self, d: AssistantDelta) -> list[bytes]:
        out: list[bytes] = []
        if d.reasoning:
            if self.open != "thinking":
                out += self._start({"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning}))
        if d.content:
            text = self.held + d.content
            if self.open != "text" and not text.strip():
                self.held = text
            else:
                self.held = ""
                if self.open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
        for call in d.tool_calls:
            out += self._call(call)
        return out

    def _call(self, call: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if call.id is not None:
            self.held = ""
            self.num_calls += 1
            out += self._start({"type": "tool_use", "id": call.id, "name": call.name or "", "input": {}})
        if call.arguments and self.open == "tool_use":
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        return [*out, _event("content_block_stop", index=self.index)]
