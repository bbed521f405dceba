"""Pydantic shapes of OpenAI's Responses API as blazr serves it (POST /v1/responses and
/v1/responses/input_tokens; the front-end is openai_responses.py).

Requests validate as strictly as chat completions' (schemas.py): unknown fields are a 400 naming them. What
is accepted:
  - `input` (a string, or items: messages with `input_text` / `output_text` / `refusal` parts,
    `function_call`, `function_call_output`, `reasoning`), `instructions`, `previous_response_id`, function
    `tools`, `tool_choice` (none / auto / required / a function), `parallel_tool_calls`, `text.format`
    (text, json_object, json_schema), `reasoning.effort`, `max_output_tokens`, `temperature`, `top_p`,
    `top_logprobs`, `stream`, `store` (kept for `previous_response_id` and GET, bounded: response_store.py);
  - advisory fields, accepted with no effect: `metadata`, `user`, `safety_identifier`, `service_tier`,
    `prompt_cache_key` (`blazr serve --ray` routes by it), `prompt_cache_retention`, `text.verbosity`,
    `reasoning.summary` / `generate_summary` / `context` / `mode`, `stream_options.include_obfuscation`,
    `include` (`reasoning.encrypted_content`: blazr sends reasoning as text, never encrypted;
    `message.output_text.logprobs` with `top_logprobs`), `truncation` (the input is never cut: one too
    long for the context is a 400), `max_tool_calls` (blazr runs no tools of its own);
  - vLLM's sampling extras through `extra_body`: top_k, min_p, repetition_penalty, presence_penalty,
    frequency_penalty, seed, stop, priority, cache_salt, thinking_token_budget.
What blazr cannot do stays a 400: `background`, `conversation`, `prompt` templates, built-in tools
(web search, file search, …), images and files, `item_reference`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from blazr.server.schemas import (
    MAX_INT32,
    MAX_LABEL_CHARS,
    MAX_LOGPROBS,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
    FunctionName,
    JsonObject,
    Label,
    OpenResponse,
    ReasoningEffort,
    RequestModel,
    StopString,
)


class _Item(BaseModel):
    """An input item: its own fields strict, the output-side fields clients echo back (`id`, `status`)
    accepted."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    id: Label | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputText(RequestModel):
    type: Literal["input_text"]
    text: str


class OutputText(RequestModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(RequestModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]


class MessageItem(_Item):
    """A message (`type` may be left out, as the SDK's easy input message does)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    name: FunctionName
    arguments: str
    namespace: Label | None = None


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    output: str | list[InputText | OutputText]


class SummaryText(RequestModel):
    type: Literal["summary_text"]
    text: str


class ReasoningText(RequestModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


def _item_kind(value: Any) -> str:
    """An item's tag: its `type` (a message may leave it out)."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(RequestModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class FunctionChoice(RequestModel):
    type: Literal["function"]
    name: FunctionName


class TextFormat(RequestModel):
    """`text.format`: `text`, `json_object`, or `json_schema` (`name`, `schema`, `strict`)."""

    model_config = ConfigDict(populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    description: str | None = None
    schema_: JsonObject | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(RequestModel):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = None


class StreamOptions(RequestModel):
    include_obfuscation: bool | None = None


Includable = Literal[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
]


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class ResponseInputFields(RequestModel):
    """What the model is shown: shared by POST /v1/responses and /v1/responses/input_tokens."""

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        """An item of a kind blazr does not take is named as such (not as a union's every complaint)."""
        if isinstance(value, list):
            for i, item in enumerate(value):
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if isinstance(kind, str) and kind not in ITEM_TYPES:
                    raise ValueError(
                        f"input[{i}]: items of type {kind!r} are not supported ({', '.join(ITEM_TYPES)} are)"
                    )
        return value

    model: str | None = None
    input: str | Annotated[list[InputItem], Field(max_length=1 << 16)] | None = None
    instructions: str | None = None
    previous_response_id: Label | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None


class ResponsesRequest(ResponseInputFields):
    """POST /v1/responses."""

    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = None
    include: list[Includable] | None = None
    background: bool | None = None  # only false
    max_tool_calls: int | None = Field(default=None, ge=1, le=MAX_INT32)
    metadata: Annotated[dict[str, Label], Field(max_length=16)] | None = None
    user: Label | None = None
    safety_identifier: Label | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prompt_cache_key: Label | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1, le=MAX_INT32)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    priority: int = Field(default=0, ge=-MAX_INT32, le=MAX_INT32)
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)] | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0, le=MAX_INT32)


class InputTokensRequest(ResponseInputFields):
    """POST /v1/responses/input_tokens: the tokens a response's input would take."""


# ------------------------------------------------------------------------------------------ responses


class ResponseObject(OpenResponse):
    """A response (`object: "response"`): its output items (`reasoning`, `message`, `function_call`),
    status, usage and the request's settings, as OpenAI's; documented loosely (the items are OpenAI's)."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


class ResponseDeleted(OpenResponse):
    id: str
    object: Literal["response"] = "response"
    deleted: bool


class InputTokensResponse(OpenResponse):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
