"""Pydantic shapes of the endpoints around generation: POST /tokenize and /detokenize (vLLM's shapes),
GET /v1/models (OpenAI's list, plus a multi-model server's per-model `status`), GET /health and /version,
and the OpenAI error body every 4xx / 5xx of the OpenAI-style routes carries.

Requests validate as the completions' do (schemas.py's `RequestModel`: strict, unknown fields a 400);
`TokenizeChatRequest` takes chat's conversation fields (`ChatPromptFields`). In: request JSON (routes.py,
tokenizing.py). Out: response bodies (tokenizing.py, model_cards.py, serving.py, routes.py) and the error
body (errors.py, openapi.py).
"""

from __future__ import annotations

from typing import Literal

from blazr.server.schemas import ChatPromptFields, RequestModel, ResponseModel, TokenId


class TokenizeRequest(RequestModel):
    """POST /tokenize (vLLM's shape), a text prompt: the ids /v1/completions would prefill for it."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # False: no BOS (control tokens written in the text still count)
    return_token_strs: bool = False


class TokenizeChatRequest(ChatPromptFields):
    """POST /tokenize with `messages`: the ids /v1/chat/completions would prefill for the conversation."""

    model: str | None = None
    return_token_strs: bool = False


class DetokenizeRequest(RequestModel):
    """POST /detokenize: the text of token ids (control tokens included, as vLLM's)."""

    model: str | None = None
    tokens: list[TokenId]


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # each token's text (a partial UTF-8 character as U+FFFD)


class DetokenizeResponse(ResponseModel):
    prompt: str


class ModelStatus(ResponseModel):
    """A multi-model server's state of a model (as llama-server's router: `{"value": "loaded"}`)."""

    value: Literal["unloaded", "loading", "loaded", "sleeping", "failed"]
    error: str | None = None  # why `failed`, one line
    load_seconds: float | None = None  # its last load


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "blazr"
    root: str | None = None
    max_model_len: int | None = None
    status: ModelStatus | None = None  # multi-model servers only


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class HealthStatus(ResponseModel):
    """GET /health: `ok` (200); `loading`, `draining` or `error` (503, with a one-line reason)."""

    status: Literal["ok", "loading", "draining", "error"]
    error: str | None = None


class VersionInfo(ResponseModel):
    version: str
