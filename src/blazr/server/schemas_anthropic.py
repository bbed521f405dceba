"""Pydantic shapes of Anthropic's Messages API as blazr serves it (POST /v1/messages and
/v1/messages/count_tokens; the front-end is anthropic_messages.py).

Both request shapes in use are accepted: today's SDK (anthropic 2.x: `output_config` with `effort` and a
JSON-schema `format`, system messages inside `messages`, no sampling fields) and older clients' (`system`,
`temperature`, `top_p`, `top_k`, the beta `output_format`). Unknown fields are a 400 naming them. Accepted:
  - `model`, `max_tokens` (≥ 1), `messages` (content a string or blocks: `text`, `tool_use`, `tool_result`,
    `thinking`, `redacted_thinking` — the last carries nothing blazr can read and is dropped), `system`,
    `stop_sequences`, `stream`, `tools` (client tools: `name`, `description`, `input_schema`),
    `tool_choice` (`auto`, `any`, `tool`, `none`; `disable_parallel_tool_use`), `thinking` (`enabled` with
    `budget_tokens`, `disabled`, `adaptive`, `between_tools`), `output_config`, `temperature` (0–1),
    `top_p`, `top_k`;
  - advisory, no effect: `metadata` (its `user_id` is logged), `service_tier`, `speed`, `inference_geo`,
    `cache_control` (top level and on blocks and tools: blazr's prefix cache is automatic), `diagnostics`,
    `user_profile_id`, `workspace_id`, a text block's `citations`, a tool's `strict` (the arguments of a
    forced call are always held to the schema), `input_examples`, `eager_input_streaming`, `display`.
What blazr cannot do stays a 400: images, documents and search results in content, server tools (web
search, code execution, bash, …), `container`, `max_tokens` 0 (pre-warming the cache).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from blazr.server.schemas import (
    MAX_INT32,
    MAX_LABEL_CHARS,
    MAX_TOOLS,
    JsonObject,
    Label,
    OpenResponse,
    RequestModel,
)

ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
Effort = Literal["low", "medium", "high", "xhigh", "max"]


class CacheControl(RequestModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    name: ToolName
    input: JsonObject
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None
    toolset_name: Label | None = None


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: Label | None = None


class ThinkingBlock(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(RequestModel):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(RequestModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(RequestModel):
    name: ToolName
    input_schema: JsonObject
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None
    input_examples: list[JsonObject] | None = None
    eager_input_streaming: bool | None = None
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(RequestModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0, le=MAX_INT32)
    display: Literal["summarized", "omitted"] | None = None


class JsonFormat(RequestModel):
    type: Literal["json_schema"]
    schema_: JsonObject = Field(alias="schema")
    model_config = ConfigDict(populate_by_name=True)


class OutputConfig(RequestModel):
    effort: Effort | None = None
    format: JsonFormat | None = None


class Metadata(RequestModel):
    user_id: Label | None = None


class PromptFields(RequestModel):
    """What the model is shown: shared by POST /v1/messages and /v1/messages/count_tokens."""

    model: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: JsonFormat | None = None  # the structured-outputs beta's name

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, value: Any) -> Any:
        """A server tool (web search, code execution, bash, …) is named as such."""
        for i, tool in enumerate(value if isinstance(value, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "custom":
                raise ValueError(f"tools[{i}]: server tools ({kind!r}) are not supported, only client tools")
        return value

    # advisory
    cache_control: CacheControl | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: Label | None = None
    workspace_id: Label | None = None


class MessagesRequest(PromptFields):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=0, le=MAX_INT32)
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT32)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: Label | None = None
    diagnostics: dict[str, Any] | None = None


class CountTokensRequest(PromptFields):
    """POST /v1/messages/count_tokens."""


# ------------------------------------------------------------------------------------------ responses


class MessageResponse(OpenResponse):
    """A message: content blocks (`thinking`, `text`, `tool_use`), stop reason, usage."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: dict[str, Any]


class TokenCount(OpenResponse):
    input_tokens: int


class AnthropicErrorInfo(OpenResponse):
    type: str
    message: str


class AnthropicError(OpenResponse):
    """Anthropic's error shape."""

    type: Literal["error"] = "error"
    error: AnthropicErrorInfo
    request_id: str | None = None
