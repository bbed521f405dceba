"""From OpenAI requests to engine inputs, and from engine outputs back to OpenAI shapes.

In:  a validated `CompletionRequest` / `ChatCompletionRequest` and the tokenizer.
Out: `PromptInput`s (token ids + the text echoed back), a `SamplingParams` with OpenAI's defaults, and
     logprobs in either layout — the legacy completions lists (`tokens`, `token_logprobs`, `top_logprobs`
     dicts, `text_offset`) or chat's `content: [{token, logprob, bytes, top_logprobs}]`.
Every client mistake becomes an `APIError` (400) naming the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import TokenLogprob
from blazr.errors import BlazrError
from blazr.server import tool_prompt
from blazr.server.errors import APIError
from blazr.server.schemas import (
    ChatCompletionRequest,
    ChatLogprobs,
    ChatPromptFields,
    CompletionLogprobs,
    SamplingFields,
    TokenLogprobEntry,
    ToolCallItem,
    TopLogprob,
)
from blazr.tokenizer import Tokenizer

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way


@dataclass
class PromptInput:
    """One prompt: its token ids and, for echo, its text (None: decode the ids when needed)."""

    ids: list[int]
    text: str | None = None


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


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


def encode_chat(
    req: ChatPromptFields, tok: Tokenizer, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt ids of a conversation; `tools` (OpenAI tool dicts) rendered by the template when it
    renders tools, else described in the system message (tool_prompt.py); `reasoning_effort` as the
    template's variables (schemas.py's `ChatPromptFields`)."""
    kwargs = {
        k: v
        for k, v in (req.chat_template_kwargs or {}).items()
        if k not in ("messages", "add_generation_prompt", "self", "tools")
    }
    if req.reasoning_effort is not None:  # a variable of the template's (gpt-oss's reads it)
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
        if req.reasoning_effort == "none":  # no thinking: Qwen3's (and its kin's) switch
            kwargs.setdefault("enable_thinking", False)
    messages = chat_messages(req)
    if tok.chat_template.uses_tools:
        if tools:
            kwargs["tools"] = tools
    else:
        messages = tool_prompt.describe_tools(messages, tools or [])
    try:
        return tok.encode_chat(messages, add_generation_prompt=req.add_generation_prompt, **kwargs)
    except (BlazrError, TypeError, ValueError) as e:
        raise bad_request(str(e), "messages") from None


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
        )
    except BlazrError as e:
        raise bad_request(str(e)) from None


# ------------------------------------------------------------------------------------------- logprobs


def _clamp(value: float) -> float:
    return MIN_LOGPROB if math.isnan(value) or value < MIN_LOGPROB else value


class CompletionLogprobsWriter:
    """Builds the legacy completions `logprobs` object piece by piece (one per stream chunk), carrying the
    text offset across pieces. The top dict holds the top-k alternatives plus the chosen token."""

    def __init__(self, tok: Tokenizer, as_token_ids: bool = False) -> None:
        self.tok = tok
        self.as_token_ids = as_token_ids
        self.offset = 0

    def _name(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.tok.token_text(token_id)

    def prompt(self, prompt_ids: Sequence[int], lps: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        """Echoed prompt tokens; the first one (and any without a logprob) gets null."""
        entries = [(t, lps[i] if i < len(lps) else None) for i, t in enumerate(prompt_ids)]
        return self._write(entries)

    def generated(self, lps: Iterable[TokenLogprob]) -> CompletionLogprobs:
        return self._write([(lp.token_id, lp) for lp in lps])

    def _write(self, entries: Sequence[tuple[int, TokenLogprob | None]]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token_id, lp in entries:
            name = self._name(token_id)
            out.tokens.append(name)
            out.text_offset.append(self.offset)
            self.offset += len(self.tok.token_text(token_id))
            if lp is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_clamp(lp.logprob))
            top = {self._name(t): _clamp(v) for t, v in lp.top}
            top.setdefault(name, _clamp(lp.logprob))
            out.top_logprobs.append(top)
        return out


def merge_completion_logprobs(parts: Iterable[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for p in parts:
        out.tokens += p.tokens
        out.token_logprobs += p.token_logprobs
        out.top_logprobs += p.top_logprobs
        out.text_offset += p.text_offset
    return out


def chat_logprobs(lps: Iterable[TokenLogprob], tok: Tokenizer, as_token_ids: bool = False) -> ChatLogprobs:
    """Chat's layout: every entry with its UTF-8 bytes and the top-k alternatives (possibly [])."""

    def name(token_id: int) -> str:
        return f"token_id:{token_id}" if as_token_ids else tok.token_text(token_id)

    entries = [
        TokenLogprobEntry(
            token=name(lp.token_id),
            logprob=_clamp(lp.logprob),
            bytes=list(tok.token_bytes(lp.token_id)),
            top_logprobs=[
                TopLogprob(token=name(t), logprob=_clamp(v), bytes=list(tok.token_bytes(t)))
                for t, v in lp.top
            ],
        )
        for lp in lps
    ]
    return ChatLogprobs(content=entries)
