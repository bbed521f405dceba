"""Pydantic shapes of Ollama's API as blazr serves it (/api/*; the front-end is ollama_api.py).

Requests: unknown top-level fields are a 400 naming them; `options` takes Ollama's option names — the ones
that sample (`num_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `repeat_penalty`,
`presence_penalty`, `frequency_penalty`, `seed`, `stop`) act, the ones about loading and hardware
(`num_ctx`, `num_batch`, `num_gpu`, `main_gpu`, `num_thread`, `numa`, `low_vram`, `use_mmap`, `use_mlock`,
`vocab_only`, `logits_all`, `embedding_only`, `num_keep`) and Ollama's own samplers that its current engine
ignores too (`mirostat*`, `tfs_z`, `typical_p`, `repeat_last_n`, `penalize_newline`) are accepted with no
effect; other option names are a 400. `keep_alive` sets how long a multi-model server keeps the model
loaded once idle (routes_ollama.py); with one model loaded at startup it has no effect.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from blazr.server.schemas import (
    MAX_INT32,
    MAX_LABEL_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
    JsonObject,
    OpenResponse,
    RequestModel,
    Tool,
)

ModelName = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
KeepAlive = float | str | None


class Options(RequestModel):
    """Ollama's `options` (see the module docstring for which act)."""

    num_predict: int | None = Field(default=None, ge=-2, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT32)
    top_p: float | None = Field(default=None, ge=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0, le=100)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)] | None = (
        None
    )
    # advisory
    num_ctx: int | None = Field(default=None, ge=0, le=MAX_INT32)
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    vocab_only: bool | None = None
    logits_all: bool | None = None
    embedding_only: bool | None = None
    num_keep: int | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    tfs_z: float | None = None
    typical_p: float | None = None
    repeat_last_n: int | None = None
    penalize_newline: bool | None = None


class ToolCallFunction(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]
    arguments: JsonObject
    index: int | None = None


class ToolCall(RequestModel):
    function: ToolCallFunction
    id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)] | None = None
    type: Literal["function"] | None = None


class Message(RequestModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None  # refused: blazr takes text only
    tool_calls: list[ToolCall] | None = None
    tool_name: Annotated[str, Field(max_length=MAX_LABEL_CHARS)] | None = None
    tool_call_id: Annotated[str, Field(max_length=MAX_LABEL_CHARS)] | None = None


Format = Literal["", "json"] | JsonObject
Think = bool | Literal["low", "medium", "high"]


class GenerationFields(RequestModel):
    model: ModelName
    format: Format | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatRequest(GenerationFields):
    """POST /api/chat (streamed unless `stream` is false)."""

    messages: list[Message] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None


class GenerateRequest(GenerationFields):
    """POST /api/generate (streamed unless `stream` is false)."""

    prompt: str | None = None
    suffix: str | None = None  # refused when set: no fill-in-the-middle
    system: str | None = None
    template: str | None = None  # refused when set: the model's chat template is used
    context: list[Annotated[int, Field(ge=0, le=MAX_INT32)]] | None = None
    raw: bool | None = None
    images: list[str] | None = None  # refused


class EmbedRequest(RequestModel):
    """POST /api/embed."""

    model: ModelName
    input: str | Annotated[list[str], Field(min_length=1)]
    truncate: bool | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    dimensions: int | None = Field(default=None, ge=1, le=MAX_INT32)


class EmbeddingsRequest(RequestModel):
    """POST /api/embeddings (the older, one-prompt form)."""

    model: ModelName
    prompt: str
    options: Options | None = None
    keep_alive: KeepAlive = None


class ShowRequest(RequestModel):
    """POST /api/show (`name` is the older spelling of `model`)."""

    model: ModelName | None = None
    name: ModelName | None = None
    verbose: bool | None = None


# ------------------------------------------------------------------------------------------ responses


class OllamaError(OpenResponse):
    error: str


class VersionResponse(OpenResponse):
    version: str


class ModelList(OpenResponse):
    models: list[dict[str, Any]]


class ShowResponse(OpenResponse):
    model_info: dict[str, Any]
    details: dict[str, Any]
    capabilities: list[str]


class ChatResponse(OpenResponse):
    model: str
    created_at: str
    message: dict[str, Any]
    done: bool


class GenerateResponse(OpenResponse):
    model: str
    created_at: str
    response: str
    done: bool


class EmbedResponse(OpenResponse):
    model: str
    embeddings: list[list[float]]


class EmbeddingResponse(OpenResponse):
    embedding: list[float]
