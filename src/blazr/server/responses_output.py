"""The Responses API's answer: one response's `ChatRun` (chat_run.py) as the response object — its output
items, status, usage and the request's echoed settings — or as Server-Sent Events, stored for
`previous_response_id` and GET (response_store.py) unless `store` is false.

Output items, in order: `reasoning` (its text as `reasoning_text` content; no summary is made), a
`message` with one `output_text` part (left out when the model only called tools), one `function_call` per
call. Status `completed`, or `incomplete` with `incomplete_details.reason` `max_output_tokens`.

Streamed (Server-Sent Events `event: <type>` / `data: {…, "sequence_number"}`): response.created,
response.in_progress; for each item output_item.added, its content part's content_part.added, the deltas
(reasoning_text.delta, output_text.delta, function_call_arguments.delta), then reasoning_text.done /
output_text.done / function_call_arguments.done, content_part.done, output_item.done; finally
response.completed or response.incomplete (an `error` event if the request fails midway, sent by
transport.py). Whitespace-only text beside tool calls makes no message item, streamed or not.

In: the `Serving`, the started `ChatRun`, the `ResponsesRequest`, the model name and the conversation's
messages. Out: `ResponseJob.collect` (the response body) and `ResponseJob.events` (the SSE bytes). Used by
openai_responses.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from blazr.server import response_out
from blazr.server.assistant import AssistantDelta
from blazr.server.chat_run import ChatRun, ChoiceResult
from blazr.server.schemas_responses import FunctionChoice, ResponsesRequest
from blazr.server.serving import Serving
from blazr.server.tool_call_text import ToolCallDelta


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
