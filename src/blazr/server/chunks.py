"""A stream's chunks as SSE bytes (`data: {chunk}\\n\\n`), the common one prebuilt.

Nearly every event of a stream is one choice's text delta — no logprobs, no finish reason. Its bytes are a
per-response prefix, the JSON-escaped text and a fixed suffix, so `ChunkEncoder.text()` costs one string
escape instead of building, validating and dumping pydantic models for every token. Every other chunk (the
role, logprobs, a finish reason, the usage-only last chunk) goes through the schemas with `event()`, which
is also the reference: tests check that both give the same bytes for the same chunk.

Every event is one line: the line breaks `str.splitlines()` knows beyond JSON's escapes are escaped too.

Usage on chunks, as OpenAI and vLLM send it (`stream_options`): absent unless `include_usage`; then
`"usage": null` on every chunk and the totals on a last chunk with no choices; with vLLM's
`continuous_usage_stats` as well, every chunk carries the usage so far (the prompt's tokens, the choice's
completion tokens until then). Every usage holds `prompt_tokens_details.cached_tokens` (schemas.Usage says
why always): the prompt's tokens served from the prefix cache.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from blazr.server.schemas import (
    ChatCompletionChunk,
    CompletionChunk,
    PromptTokensDetails,
    StreamOptions,
    Usage,
)

UsageMode = Literal["off", "final", "continuous"]

# The same escaping as pydantic's serializer: the short forms for \" \\ \b \f \n \r \t, \u00XX (lower-case)
# for other control characters, everything else (non-ASCII included) as UTF-8 ...
_json_string = json.encoder.encode_basestring  # type: ignore[attr-defined]

# ... except the three line breaks of str.splitlines() that JSON leaves raw (NEL, LINE and PARAGRAPH
# SEPARATOR): a client reading the stream line by line with httpx's `aiter_lines` (guidellm does) would cut
# an event in two at one of them (a sampled token can be one). Escaped, the JSON means the same.
_LINE_BREAKS = ("\x85", "\u2028", "\u2029")
_ESCAPE_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in _LINE_BREAKS})


def _safe(json_text: str) -> str:
    """`json_text` with the line breaks above escaped (they can only occur inside its strings)."""
    if any(c in json_text for c in _LINE_BREAKS):
        return json_text.translate(_ESCAPE_BREAKS)
    return json_text


def _escape(text: str) -> str:
    return _safe(_json_string(text))


def usage_mode(options: StreamOptions | None) -> UsageMode:
    if options is None or not options.include_usage:
        return "off"
    return "continuous" if options.continuous_usage_stats else "final"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """The usage of `prompt_tokens` (`cached_tokens` of them from the prefix cache) and
    `completion_tokens`."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class ChunkEncoder:
    """The SSE events of one streamed response (`chunk_type` with its id, created time and model)."""

    def __init__(
        self,
        chunk_type: type[ChatCompletionChunk] | type[CompletionChunk],
        response_id: str,
        created: int,
        model: str,
        mode: UsageMode,
    ) -> None:
        self.chunk_type = chunk_type
        self.mode = mode
        obj = chunk_type.model_fields["object"].default
        head = f'{{"id":{_escape(response_id)},"object":"{obj}","created":{created},"model":{_escape(model)}'
        self._head = "data: " + head + ',"choices":[{"index":'
        field = '"delta":{"content":' if chunk_type is ChatCompletionChunk else '"text":'
        self._field = "," + field
        close = "}" if chunk_type is ChatCompletionChunk else ""
        self._tail = close + ',"logprobs":null,"finish_reason":null}]'
        self._end = ',"system_fingerprint":null}\n\n'
        if mode == "final":
            self._end = ',"usage":null' + self._end

    def text(self, index: int, text: str, usage_so_far: Usage | None = None) -> bytes:
        """A chunk of one choice's text delta (no logprobs, not finished); `usage_so_far` in continuous
        mode (ignored otherwise)."""
        end = self._end
        if self.mode == "continuous":
            assert usage_so_far is not None, "continuous usage needs the usage so far"
            u = usage_so_far
            end = (
                f',"usage":{{"prompt_tokens":{u.prompt_tokens},"completion_tokens":{u.completion_tokens},'
                f'"total_tokens":{u.total_tokens},'
                f'"prompt_tokens_details":{{"cached_tokens":{u.prompt_tokens_details.cached_tokens}}}}}' + end
            )
        return (self._head + str(index) + self._field + _escape(text) + self._tail + end).encode()

    def event(self, chunk: BaseModel, extra: dict[str, Any] | None = None) -> bytes:
        """Any chunk through its schema. Off: no `usage` key; final: `usage` as set (null but on the last
        chunk); continuous: the caller sets the usage on every chunk. `extra`: top-level keys added (vLLM's
        `prompt_logprobs` on the first chunks)."""
        text = chunk.model_dump_json(exclude={"usage"} if self.mode == "off" else None)
        if extra:
            text = text[:-1] + "," + json.dumps(extra, ensure_ascii=False)[1:]
        return b"data: " + _safe(text).encode() + b"\n\n"
