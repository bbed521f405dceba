"""Request in: from OpenAI-shaped request fields to engine inputs (response_out.py is the way back).

In:  a validated `CompletionRequest` / `ChatCompletionRequest` (or the shared fields other front-ends fill
     the same way) and the tokenizer.
Out: `PromptInput`s (token ids + the text echoed back), chat messages in the chat template's conventions
     (what a `Conversation`, conversation.py, holds), and a `SamplingParams` with OpenAI's defaults and
     vLLM's extras (cache_salt, priority, prompt_logprobs, thinking_token_budget among them).
Every client mistake becomes an `APIError` (400) naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from blazr.engine.sampling import SamplingParams
from blazr.errors import BlazrError
from blazr.server.errors import bad_request
from blazr.server.schemas import (
    ChatCompletionRequest,
    ChatPromptFields,
    SamplingFields,
    ToolCallItem,
)
from blazr.tokenizer import Tokenizer

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions


@dataclass
class PromptInput:
    """One prompt: its token ids and, for echo, its text (None: decode the ids when needed)."""

    ids: list[int]
    text: str | None = None


def shorten(value: str, limit: int = 64) -> str:
    """A client's value quoted back in an error, cut to `limit` characters."""
    return value if len(value) <= limit else value[:limit] + "…"


# -------------------------------------------------------------------------------------------- prompts


def completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]], tok: Tokenizer
) -> list[PromptInput]:
    """The four shapes of `prompt`: a string, strings, token ids, lists of token ids."""
    if isinstance(prompt, str):
        return [PromptInput(tok.encode(prompt), prompt)]
    if not prompt:
        raise bad_request(
            "prompt is empty: give a string, strings, token ids or lists of token ids", "prompt"
        )
    first = prompt[0]
    if isinstance(first, str):
        return [PromptInput(tok.encode(p), p) for p in prompt]  # type: ignore[arg-type]
    if isinstance(first, int):
        return [PromptInput(list(prompt))]  # type: ignore[arg-type]
    return [PromptInput(list(p)) for p in prompt]  # type: ignore[union-attr]


def chat_messages(req: ChatPromptFields) -> list[dict[str, Any]]:
    """Messages as the chat template expects them (HF's conventions): `developer` is OpenAI's new name for
    `system`; `name`, `tool_call_id` and `reasoning_content` (or its other name, `reasoning`) are passed on;
    an assistant's `tool_calls` carry their arguments as an object (templates iterate or `tojson` them), not
    as JSON text."""
    out = []
    for i, m in enumerate(req.messages):
        content: Any = m.content
        if content is None and m.role != "assistant":
            raise bad_request(f"messages[{i}]: a {m.role} message needs content", f"messages.{i}.content")
        if m.role == "assistant" and content is None and not m.tool_calls:
            raise bad_request(
                f"messages[{i}]: an assistant message needs content or tool_calls", f"messages.{i}.content"
            )
        if m.tool_calls is not None and m.role != "assistant":
            raise bad_request(
                f"messages[{i}]: only assistant messages have tool_calls", f"messages.{i}.tool_calls"
            )
        if (m.tool_call_id is not None) != (m.role == "tool"):
            what = "a tool message needs" if m.role == "tool" else f"a {m.role} message has no"
            raise bad_request(f"messages[{i}]: {what} tool_call_id", f"messages.{i}.tool_call_id")
        if isinstance(content, list):
            content = _text_parts(content, i)
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        reasoning = _reasoning(m.reasoning_content, m.reasoning, i)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if m.tool_calls:
            message["tool_calls"] = [_tool_call(c, i, j) for j, c in enumerate(m.tool_calls)]
        out.append(message)
    return out


def _reasoning(content: str | None, alias: str | None, i: int) -> str | None:
    """A message's reasoning, given as `reasoning_content` or `reasoning` (vLLM's and Ollama's name); both
    are fine when they agree."""
    if content is not None and alias is not None and content != alias:
        raise bad_request(
            f"messages[{i}]: reasoning and reasoning_content differ; give one", f"messages.{i}.reasoning"
        )
    return content if content is not None else alias


def _text_parts(content: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise bad_request(
                f"messages[{i}].content[{j}]: parts of type {kind!r} are not supported, only 'text'",
                f"messages.{i}.content.{j}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(
                f"messages[{i}].content[{j}]: a text part needs a string 'text'",
                f"messages.{i}.content.{j}.text",
            )
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            raise bad_request(
                f"messages[{i}].content[{j}]: unsupported field {extra[0]!r}",
                f"messages.{i}.content.{j}.{extra[0]}",
            )
        parts.append({"type": "text", "text": text})
    return parts


def _tool_call(call: ToolCallItem, i: int, j: int) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request(
            f"messages[{i}].tool_calls[{j}].function.arguments: expected the JSON text of an object, found "
            f"{shorten(call.function.arguments)!r}",
            f"messages.{i}.tool_calls.{j}.function.arguments",
        )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


# --------------------------------------------------------------------------------------------- params


def check_unsupported(req: SamplingFields) -> None:
    """What the schema accepts but only together with other fields."""
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")


def sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int,
    vocab_size: int,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """OpenAI's defaults where a field is absent: temperature 1, top_p 1, no top_k/min_p, no penalties."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({req.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
    bad_ids = [t for t in req.stop_token_ids or () if t >= vocab_size]
    if bad_ids:
        raise bad_request(
            f"stop_token_ids: token id {bad_ids[0]} is out of range [0, {vocab_size})", "stop_token_ids"
        )
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias: key {shorten(key)!r} is not a token id", "logit_bias")
        token = int(key)
        if not 0 <= token < vocab_size:
            raise bad_request(f"logit_bias: token id {token} is out of range [0, {vocab_size})", "logit_bias")
        bias[token] = float(value)  # the schema bounds it to [-100, 100]
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            seed=req.seed,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=bias,
            stop=stop,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            n=req.n,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            priority=req.priority,
            cache_salt=req.cache_salt,
        )
    except BlazrError as e:
        raise bad_request(str(e)) from None


def basic_params(
    *,
    max_tokens: int,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    stop: str | list[str] | None = None,
    logprobs: int | None = None,
    priority: int = 0,
    cache_salt: str | None = None,
) -> SamplingParams:
    """The sampling parameters of the other front-ends (Responses, Anthropic, Ollama), OpenAI's defaults
    where a field is absent (temperature 1, top_p 1, no top_k); a value the sampler refuses is a 400."""
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            top_k=top_k or 0,
            min_p=min_p or 0.0,
            seed=seed,
            repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
            presence_penalty=presence_penalty or 0.0,
            frequency_penalty=frequency_penalty or 0.0,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            logprobs=logprobs,
            priority=priority,
            cache_salt=cache_salt,
        )
    except BlazrError as e:
        raise bad_request(str(e)) from None
