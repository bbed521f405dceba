"""OpenAI's Responses API — POST /v1/responses, GET / DELETE /v1/responses/{id}, POST
/v1/responses/input_tokens — as a thin translation onto the chat core: the request's input items become a
`Conversation` (conversation.py), the model's reasoning, text and tool calls come back from its `ChatRun`
(chat_run.py) as output items.

Input: a string (one user message) or items — messages (`developer` is `system`; text parts joined with
newlines), `function_call` (an assistant turn's calls; consecutive ones, and one right after an assistant
message, join that turn), `function_call_output` (a tool message), `reasoning` (the next assistant turn's
`reasoning_content`). `instructions` come first as a system message, and are not carried over by
`previous_response_id`, which puts the stored conversation (response_store.py) before the input.

Output items, in order: `reasoning` (its text as `reasoning_text` content; no summary is made), a
`message` with one `output_text` part (left out when the model only called tools), one `function_call` per
call. Status `completed`, or `incomplete` with `incomplete_details.reason` `max_output_tokens`.

Streamed (Server-Sent Events `event: <type>` / `data: {…, "sequence_number"}`): response.created,
response.in_progress; for each item output_item.added, its content part's content_part.added, the deltas
(reasoning_text.delta, output_text.delta, function_call_arguments.delta), then reasoning_text.done /
output_text.done / function_call_arguments.done, content_part.done, output_item.done; finally
response.completed or response.incomplete (an `error` event if the request fails midway). Whitespace-only
text beside tool calls makes no message item, streamed or not.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from blazr.engine.grammar import StructuredOutput
from blazr.errors import BlazrError
from blazr.server import request_in, response_out
from blazr.server.assistant import AssistantDelta
from blazr.server.chat_run import ChatRun, ChoiceResult
from blazr.server.conversation import Conversation, ToolChoice
from blazr.server.errors import APIError, bad_request
from blazr.server.middleware import request_id
from blazr.server.response_store import ResponseStore
from blazr.server.schemas_responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    MessageItem,
    ReasoningItem,
    ResponseInputFields,
    ResponsesRequest,
)
from blazr.server.serving import Serving
from blazr.server.tool_call_text import ToolCallDelta
from blazr.server.transport import run_until_disconnect, sse_response

PARAMS = {
    "messages": "input",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "tool_name": "tool_choice.name",
    "format": "text.format",
}

# ----------------------------------------------------------------------------------------------- input


def conversation(req: ResponseInputFields, store: ResponseStore) -> tuple[Conversation, list[dict[str, Any]]]:
    """The request's conversation, and its messages without the instructions (what a stored response keeps
    for the next `previous_response_id`)."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None:
            name = request_in.shorten(req.previous_response_id)
            raise bad_request(
                f"previous response {name!r} not found (never stored, deleted, or evicted: blazr keeps a "
                "bounded number in memory)",
                "previous_response_id",
            )
        history = list(previous.messages)
    messages = history + input_messages(req.input)
    if not messages:
        raise bad_request("input is empty: give a string or at least one item", "input")
    shown = [{"role": "system", "content": req.instructions}, *messages] if req.instructions else messages
    tools = [
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})}
        for t in req.tools or ()
    ]
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice):
        tool_choice = ToolChoice("required", choice.name)
    else:
        tool_choice = ToolChoice(choice or "auto")
    effort = req.reasoning.effort if req.reasoning is not None else None
    conv = Conversation(
        messages=shown,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=_format(req),
        thinking_budget=getattr(req, "thinking_token_budget", None),
        reasoning_effort=effort,
        params=PARAMS,
    )
    return conv, messages


def _format(req: ResponseInputFields) -> StructuredOutput | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    try:
        if fmt.type == "json_object" or fmt.schema_ is None:
            return StructuredOutput(json_object=True)
        return StructuredOutput(json_schema=fmt.schema_, strict=bool(fmt.strict))
    except BlazrError as e:
        raise bad_request(str(e), "text.format") from None


def input_messages(items: str | list[Any] | None) -> list[dict[str, Any]]:
    """Input items as chat messages (see the module docstring)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    reasoning = ""  # a reasoning item's text, for the next assistant turn
    names: dict[str, str] = {}  # call id → function name (tool messages name it)
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            message: dict[str, Any] = {"role": "system" if item.role == "developer" else item.role}
            message["content"] = _text(item.content)
            if item.role == "assistant" and reasoning:
                message["reasoning_content"], reasoning = reasoning, ""
            out.append(message)
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name}}
            call["function"]["arguments"] = _arguments(item.arguments, i)
            names[item.call_id] = item.name
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if reasoning:
                message["reasoning_content"], reasoning = reasoning, ""
            out.append(message)
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output if isinstance(item.output, str) else _text(item.output)
            tool = {"role": "tool", "tool_call_id": item.call_id, "content": output}
            if item.call_id in names:
                tool["name"] = names[item.call_id]
            out.append(tool)
        elif isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            reasoning += "\n".join(p.text for p in parts)
    return out


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.refusal if p.type == "refusal" else p.text for p in content)


def _arguments(text: str, i: int) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise bad_request(
            f"input[{i}].arguments: expected the JSON text of an object, found {request_in.shorten(text)!r}",
            f"input.{i}.arguments",
        )
    return value


# -------------------------------------------------------------------------------------------- endpoints


async def create(s: Serving, req: ResponsesRequest, raw: Request) -> Response:
    model = s.check_model(req.model)
    rid = request_id(raw.scope)
    if req.background:
        raise bad_request("background responses are not supported", "background")
    logprobs = None
    if req.include and "message.output_text.logprobs" in req.include:
        logprobs = req.top_logprobs or 0
    for name in ("message.input_image.image_url", "computer_call_output.output.image_url"):
        if req.include and name in req.include:
            raise bad_request(f"include {name!r}: blazr takes no images", "include")
    params = request_in.basic_params(
        max_tokens=req.max_output_tokens or s.engine.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        stop=req.stop,
        logprobs=logprobs,
        priority=req.priority,
        cache_salt=req.cache_salt,
    )
    conv, messages = await s.off_loop(conversation, req, s.responses)
    job_id = f"resp_{rid}"
    run = await s.start_chat(conv, params, job_id, req.max_output_tokens)
    job = ResponseJob(s, run, req, model, messages)
    if req.stream:
        return sse_response(job.events(), run.stream, rid, "responses")
    return await run_until_disconnect(raw, job.collect(), rid)


def retrieve(s: Serving, response_id: str) -> dict[str, Any]:
    stored = s.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored.response


def delete(s: Serving, response_id: str) -> dict[str, Any]:
    if not s.responses.delete(response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _not_found(response_id: str) -> APIError:
    message = f"response {request_in.shorten(response_id)!r} not found (never stored, deleted, or evicted)"
    return APIError(404, message, param="response_id", code="not_found")


async def input_tokens(s: Serving, req: ResponseInputFields) -> dict[str, Any]:
    """The tokens the response's input would take (the prompt /v1/responses would prefill)."""
    s.check_model(req.model)
    conv, _ = await s.off_loop(conversation, req, s.responses)
    s.check_prompt_chars(conv.num_chars(), "input")
    ids = await s.off_loop(s.format.render, conv)
    return {"object": "response.input_tokens", "input_tokens": len(ids)}


# ---------------------------------------------------------------------------------------------- output


class ResponseJob:
    """One response's answer, from its `ChatRun`: a body or SSE events; stored when asked."""

    def __init__(
        self, s: Serving, run: ChatRun, req: ResponsesRequest, model: str, messages: list[dict[str, Any]]
    ) -> None:
        self.s = s
        self.run = run
        self.req = req
        self.model = model
        self.messages = messages
        self.id = run.id
        self.created = time.time()

    def _response(self, status: str, output: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        text = {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}}
        if req.text is not None and req.text.verbosity is not None:
            text["verbosity"] = req.text.verbosity
        tool_choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, FunctionChoice) else None
        reasoning_text = "".join(
            c["text"] for item in output if item["type"] == "reasoning" for c in item.get("content", ())
        )
        done = status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": time.time() if done else None,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "metadata": req.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "prompt_cache_key": req.prompt_cache_key,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "safety_identifier": req.safety_identifier,
            "service_tier": "default",
            "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": text,
            "tool_choice": tool_choice or req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": self._usage(reasoning_text) if done else None,
            "user": req.user,
        }

    def _usage(self, reasoning: str) -> dict[str, Any]:
        run = self.run
        # tokens of the reasoning text (re-encoded: the engine does not label tokens)
        num_reasoning = len(self.s.tokenizer.encode_ordinary(reasoning)) if reasoning else 0
        return {
            "input_tokens": run.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": run.num_cached, "cache_write_tokens": 0},
            "output_tokens": run.num_generated,
            "output_tokens_details": {"reasoning_tokens": min(num_reasoning, run.num_generated)},
            "total_tokens": run.num_prompt_tokens + run.num_generated,
        }

    def _status(self, finish: str | None) -> str:
        return "incomplete" if finish == "length" else "completed"

    def _store(self, response: dict[str, Any]) -> None:
        if self.req.store is False:
            return
        self.s.responses.put(response, [*self.messages, _assistant_message(response["output"])])

    def _logprobs(self, lps: list) -> list[dict[str, Any]]:
        if self.run.params.logprobs is None:
            return []
        entries = response_out.chat_logprobs(lps, self.s.tokenizer).content or []
        return [e.model_dump() for e in entries]

    async def collect(self) -> dict[str, Any]:
        result = (await self.run.results())[0]
        output = self._items(result)
        response = self._response(self._status(result.finish_reason), output, result.finish_reason)
        self._store(response)
        return response

    def _items(self, r: ChoiceResult) -> list[dict[str, Any]]:
        rid = self.id.removeprefix("resp_")
        out: list[dict[str, Any]] = []
        if r.reasoning:
            out.append(_reasoning_item(f"rs_{rid}", r.reasoning, "completed"))
        content = r.content
        if content and not (r.tool_calls and not content.strip()):
            text = _output_text(content, self._logprobs(r.logprobs))
            out.append(_message_item(f"msg_{rid}", [text], "completed"))
        for i, c in enumerate(r.tool_calls):
            out.append(_call_item(f"fc_{rid}_{i}", c.id, c.name, c.arguments, "completed"))
        return out

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE events (see the module docstring)."""
        stream = _EventWriter(self)
        yield stream.event("response.created", response=self._response("in_progress", [], None))
        yield stream.event("response.in_progress", response=self._response("in_progress", [], None))
        finish = None
        async for steps in self.run.steps():
            parts: list[bytes] = []
            for step in steps:
                parts += stream.feed(step.delta, self._logprobs(step.logprobs) if step.logprobs else [])
                if step.finished:
                    finish = step.finish_reason
            if parts:
                yield b"".join(parts)
        tail = stream.close()
        response = self._response(self._status(finish), stream.output, finish)
        self._store(response)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield b"".join(tail) + stream.event(kind, response=response)


class _EventWriter:
    """The item events of one streamed response: opens, grows and closes its output items."""

    def __init__(self, job: ResponseJob) -> None:
        self.rid = job.id.removeprefix("resp_")
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # every item opened, in order (closed ones completed)
        self.open: dict[str, Any] | None = None  # the item growing now
        self.text = ""  # its text (reasoning / message) or arguments
        self.held = ""  # message whitespace not sent yet (it may only sit beside tool calls)
        self.logprobs: list[dict[str, Any]] = []
        self.num_calls = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        data = json.dumps(body, ensure_ascii=False).encode()
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        self.open, self.text = item, ""
        self.output.append(item)
        out = [self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)]
        part = {"reasoning": {"type": "reasoning_text", "text": ""}, "message": _output_text("", [])}
        if item["type"] in part:
            out.append(self._part("response.content_part.added", part[item["type"]]))
        return out

    def _part(self, kind: str, part: dict[str, Any]) -> bytes:
        assert self.open is not None
        index = len(self.output) - 1
        return self.event(kind, item_id=self.open["id"], output_index=index, content_index=0, part=part)

    def feed(self, d: AssistantDelta, logprobs: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        if d.reasoning:
            if self.open is None or self.open["type"] != "reasoning":
                out += self.close()
                out += self._add(_reasoning_item(f"rs_{self.rid}", "", "in_progress"))
            out.append(self._delta("response.reasoning_text.delta", d.reasoning, content_index=0))
        if d.content:
            out += self._content(d.content, logprobs)
        for call in d.tool_calls:
            out += self._call(call)
        return out

    def _delta(self, kind: str, text: str, **fields: Any) -> bytes:
        assert self.open is not None
        self.text += text
        index = len(self.output) - 1
        return self.event(kind, item_id=self.open["id"], output_index=index, delta=text, **fields)

    def _content(self, text: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "message":
            if not (self.held + text).strip():  # whitespace: held until text follows
                self.held += text
                return out
            out += self.close()
            out += self._add(_message_item(f"msg_{self.rid}", [], "in_progress"))
            text, self.held = self.held + text, ""
        self.logprobs += logprobs
        keys = ("token", "logprob", "top_logprobs")
        delta_lps = [{k: e[k] for k in keys} for e in logprobs]
        out.append(self._delta("response.output_text.delta", text, content_index=0, logprobs=delta_lps))
        return out

    def _call(self, call: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if call.id is not None:  # a new call
            out += self.close()
            self.held = ""
            item = _call_item(f"fc_{self.rid}_{self.num_calls}", call.id, call.name or "", "", "in_progress")
            self.num_calls += 1
            out += self._add(item)
        if call.arguments and self.open is not None and self.open["type"] == "function_call":
            out.append(self._delta("response.function_call_arguments.delta", call.arguments))
        return out

    def close(self) -> list[bytes]:
        """The done events of the open item, if any."""
        item = self.open
        if item is None:
            return []
        self.open = None
        index = len(self.output) - 1
        kind, text = item["type"], self.text
        out: list[bytes] = []
        if kind == "reasoning":
            done = _reasoning_item(item["id"], text, "completed")
            base = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self.event("response.reasoning_text.done", **base, text=text))
            out.append(self.event("response.content_part.done", **base, part=done["content"][0]))
        elif kind == "message":
            part = _output_text(text, self.logprobs)
            done = _message_item(item["id"], [part], "completed")
            base = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self.event("response.output_text.done", **base, text=text, logprobs=self.logprobs))
            out.append(self.event("response.content_part.done", **base, part=part))
        else:
            done = {**item, "arguments": text, "status": "completed"}
            out.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=text,
                )
            )
        self.output[index] = done
        out.append(self.event("response.output_item.done", output_index=index, item=done))
        return out


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def _output_text(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _assistant_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output as the assistant turn of the conversation (for `previous_response_id`)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts, calls = [], []
    for item in output:
        if item["type"] == "reasoning":
            message["reasoning_content"] = "".join(c["text"] for c in item["content"])
        elif item["type"] == "message":
            texts += [c["text"] for c in item["content"]]
        else:
            try:
                arguments = json.loads(item["arguments"])
            except ValueError:
                arguments = {}
            function = {"name": item["name"], "arguments": arguments if isinstance(arguments, dict) else {}}
            calls.append({"id": item["call_id"], "type": "function", "function": function})
    message["content"] = "".join(texts) if texts or not calls else None
    if calls:
        message["tool_calls"] = calls
    return message
