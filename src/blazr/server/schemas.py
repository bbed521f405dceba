"""Pydantic shapes of OpenAI's completions and chat completions APIs as blazr serves them: requests in,
responses and stream chunks out.

Requests validate strictly (a string where a number belongs is a 400, not a coercion; NaN and Infinity are
refused) and **refuse unknown fields**: a field blazr does not honour is a 400 that names it, never silently
ignored. The accepted fields are exactly the ones declared here:
  - OpenAI's, where blazr implements them (tools, tool_choice, parallel_tool_calls, response_format
    among them); `modalities` only as `["text"]`; `reasoning_effort` goes to the chat template and caps
    the thinking (see `ChatPromptFields`); `user` and `safety_identifier` are logged with the request id;
  - OpenAI's advisory fields, which today's clients and agent frameworks send and which change nothing
    blazr could honour otherwise, accepted and ignored: `store` (blazr stores nothing, whatever it says),
    `metadata` (a label), `service_tier` (one tier; any of OpenAI's names), `verbosity` (a hint to
    OpenAI's own models), `prompt_cache_retention` and `prompt_cache_key` (the prefix cache is automatic;
    `blazr serve --ray` routes by the key, ray_router.py), `stream_options.include_obfuscation` (blazr
    sends no obfuscation padding); an assistant message's `reasoning` is vLLM's name for
    `reasoning_content`. What would change the output in a way blazr cannot (`audio`, `prediction`,
    `web_search_options`, `moderation`, `functions`, …) stays a 400;
  - vLLM's extras, sent by `openai` clients through `extra_body`: top_k, min_p, repetition_penalty,
    min_tokens, ignore_eos, stop_token_ids, skip_special_tokens, include_stop_str_in_output,
    return_tokens_as_token_ids, structured_outputs (and its older names guided_json, guided_regex,
    guided_choice, guided_grammar), prompt_logprobs, priority (the waiting queue's order: lower first),
    cache_salt (only requests with the same salt share prefix-cache blocks); for chat also
    add_generation_prompt, chat_template_kwargs and thinking_token_budget.
Limits are part of the schema (and so of /openapi.json): temperature in OpenAI's [0, 2], at most
`MAX_STOP_STRINGS` stop strings of at most `MAX_STOP_CHARS` characters, logprobs up to 20, …

Defaults (OpenAI's, not blazr's SamplingParams'): temperature 1, top_p 1, top_k off; max_tokens 16 for
completions, the rest of the context for chat.

The endpoints around generation (/tokenize, /detokenize, /v1/models, /health, /version) and the error body
have their shapes in schemas_server.py; the other APIs' in schemas_responses.py, schemas_anthropic.py,
schemas_ollama.py and embeddings.py, built on this module's `RequestModel` / `ResponseModel`, limits and
field types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 1024  # entries
MAX_LOGPROBS = 20
MAX_N = 128
MAX_INT32 = 2**31 - 1
MAX_LABEL_CHARS = 512  # user, safety_identifier, metadata values
MAX_TOOLS = 128


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenResponse(BaseModel):
    """A response documented loosely: the fields named, others allowed (the other APIs' own shapes)."""

    model_config = ConfigDict(extra="allow")


RequestModel, ResponseModel = _Request, _Response  # for the other APIs' schema modules


# ------------------------------------------------------------------------------------------- requests

TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: the usage so far on every chunk (with include_usage)
    include_obfuscation: bool | None = None  # OpenAI's padding against length side channels: none is sent


JsonObject = dict[str, Any]
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


class JsonSchemaFormat(_Request):
    """`response_format.json_schema`: OpenAI's wrapper of the schema itself."""

    model_config = ConfigDict(populate_by_name=True)
    name: FunctionName
    description: str | None = None
    schema_: JsonObject | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's `response_format`: `text` (free), `json_object` (any JSON object), `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Request):
    """vLLM's `structured_outputs` (`extra_body`): exactly one of `json` (a schema), `json_object`,
    `regex`, `choice`, `grammar` (Lark, or GBNF/EBNF). `disable_any_whitespace` is accepted for vLLM
    clients: blazr's JSON never has free whitespace."""

    model_config = ConfigDict(populate_by_name=True)
    json_: JsonObject | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool | None = None


class SamplingFields(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)]
        | None
    ) = None
    user: Label | None = None
    # vLLM extras
    top_k: int | None = Field(default=None, ge=-1, le=MAX_INT32)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    min_tokens: int = Field(default=0, ge=0, le=MAX_INT32)
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    priority: int = Field(default=0, ge=-MAX_INT32, le=MAX_INT32)
    cache_salt: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)] | None = None
    # structured output: OpenAI's response_format, vLLM's structured_outputs (and its older guided_* names)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: JsonObject | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt`: a string, strings, token ids, or lists of token ids."""

    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    suffix: str | None = None


class FunctionCall(_Request):
    name: FunctionName
    arguments: str  # JSON text of an object, as the model wrote it


class ToolCallItem(_Request):
    """An assistant message's tool call, as the client sends the history back."""

    id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    """A message; `content` is a string or a list of parts, of which blazr takes `{"type": "text", "text"}`
    (request_in.py names any other part in its 400). Assistant messages may carry `tool_calls` (then content
    may be null) and `reasoning_content` (or `reasoning`, vLLM's and Ollama's name for it: the same to the
    template); `tool` messages answer a call by its `tool_call_id`."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: Label | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefinition(_Request):
    name: FunctionName
    description: str | None = None
    parameters: JsonObject | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: FunctionName


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's values


class ChatPromptFields(_Request):
    """A conversation as the chat template renders it (shared by chat completions and /tokenize).
    `reasoning_effort` is passed to the template as the variable of that name (gpt-oss's reads it), and
    `"none"` also sets `enable_thinking` false (Qwen3's switch); `chat_template_kwargs` win over both. It
    also caps the reasoning block (conversation.py `EFFORT_BUDGETS`) unless `thinking_token_budget` does."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    reasoning_effort: ReasoningEffort | None = None
    add_generation_prompt: bool = True  # vLLM extra
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extra
    thinking_token_budget: int | None = Field(default=None, ge=0, le=MAX_INT32)  # vLLM extra


class ChatCompletionRequest(SamplingFields, ChatPromptFields):
    """POST /v1/chat/completions."""

    max_completion_tokens: int | None = Field(default=None, ge=0, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text"]] | None = None
    safety_identifier: Label | None = None
    # advisory (see the module docstring): accepted, no effect here
    store: bool | None = None
    metadata: Annotated[dict[str, Label], Field(max_length=16)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prompt_cache_key: Label | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None


# ------------------------------------------------------------------------------------------ responses


class PromptTokensDetails(_Response):
    cached_tokens: int  # prompt tokens served from the prefix cache: their prefill was skipped


class Usage(_Response):
    """Token counts; `prompt_tokens_details.cached_tokens` is the part of `prompt_tokens` found in the
    prefix cache (per prompt, not per sample: n > 1 samples share one prefill).

    The details are always present, 0 when nothing was cached or the prefix cache is off
    (`--no-prefix-cache`): OpenAI always sends them, so a client that reads
    `usage.prompt_tokens_details.cached_tokens` works against any blazr, and 0 is then the truth, not a
    placeholder. (vLLM sends them only with `--enable-prompt-tokens-details`, null otherwise.)"""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(_Response):
    """The legacy completions layout: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


PromptLogprobs = list[dict[str, dict[str, Any]] | None]  # vLLM's: per position {token id: {logprob, …}}


class CompletionBodyChoice(CompletionChoice):
    """A choice of a whole (non-streamed) completion: with the request's `prompt_logprobs`, its prompt's
    (vLLM's place for them)."""

    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionBodyChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(_Response):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprobEntry] | None = None
    refusal: list[TokenLogprobEntry] | None = None


class FunctionCallOut(_Response):
    name: str
    arguments: str  # JSON text of an object


class ToolCallOut(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(_Response):
    """`reasoning_content`: the model's thinking (with --reasoning-parser), apart from `content`, also as
    `reasoning` (vLLM's and Ollama's name for it; clients read one or the other); `tool_calls`: the calls
    the model made (finish_reason "tool_calls"), null when none."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None


ChatFinishReason = Literal["stop", "length", "tool_calls"]


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: ChatFinishReason | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # with the request's prompt_logprobs (vLLM)


class _DropNone(_Response):
    """Absent fields are left out of the JSON, as OpenAI sends stream deltas."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(_DropNone):
    name: str | None = None  # on the call's first delta
    arguments: str | None = None  # a piece of the JSON text; the pieces concatenate to the whole


class DeltaToolCall(_DropNone):
    """A piece of tool call `index`: its first delta has the id, type and name, later ones arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(_DropNone):
    """A stream delta; absent fields are left out (`{}` on a choice's final chunk), as OpenAI sends them."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text as reasoning_content (vLLM's name)
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: ChatFinishReason | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChunk(_Response):
    """A streamed /v1/completions event: the same object as the response, with deltas."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
