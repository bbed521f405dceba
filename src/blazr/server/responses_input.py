"""The Responses API's request as the chat core's input: a `ResponsesRequest`'s (or /input_tokens')
`input`, `instructions`, `previous_response_id`, tools, tool choice, `text.format` and reasoning effort
become a `Conversation` (conversation.py), with the messages a stored response keeps for the next turn.

Input: a string (one user message) or items — messages (`developer` is `system`; text parts joined with
newlines), `function_call` (an assistant turn's calls; consecutive ones, and one right after an assistant
message, join that turn), `function_call_output` (a tool message), `reasoning` (the next assistant turn's
`reasoning_content`). `instructions` come first as a system message, and are not carried over by
`previous_response_id`, which puts the stored conversation (response_store.py) before the input.

In: `ResponseInputFields` (schemas_responses.py) and the `ResponseStore`. Out: (`Conversation`, the messages
without the instructions), or a 400 `APIError` naming the bad field. Used by openai_responses.py.
"""

from __future__ import annotations

import json
from typing import Any

from blazr.engine.grammar import StructuredOutput
from blazr.errors import BlazrError
from blazr.server import request_in
from blazr.server.conversation import Conversation, ToolChoice
from blazr.server.errors import bad_request
from blazr.server.response_store import ResponseStore
from blazr.server.schemas_responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    MessageItem,
    ReasoningItem,
    ResponseInputFields,
)

PARAMS = {
    "messages": "input",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "tool_name": "tool_choice.name",
    "format": "text.format",
}


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
