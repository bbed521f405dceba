"""HTTP routes — thin: parse (off the event loop, schemas.py), hand over to `Serving`, return.

Open:       GET /health (200 ready; 503 loading, draining or failed), GET /metrics (Prometheus text),
            GET /version.
/v1/* (behind the API key when one is set; 503 while the model loads or the server drains):
            GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions;
            and vLLM's POST /tokenize, POST /detokenize (the same guard).
Every status a route can answer is declared for /openapi.json (openapi.py).

Several models (a `ModelPool`, model_pool.py): a POST picks its model by the body's `model` field (none:
the first model), loaded on first use and held in use until its response is complete; /health answers 200
once the server is up, and /v1/models lists every model with its state.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError

import blazr
from blazr.server import (
    embeddings,
    model_cards,
    openai_chat,
    openai_completions,
    openai_responses,
    tokenizing,
)
from blazr.server.errors import APIError, validation_message
from blazr.server.middleware import on_response_done, request_id
from blazr.server.model_pool import ModelPool, PoolEntry
from blazr.server.openapi import documented, request_body
from blazr.server.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from blazr.server.schemas_responses import (
    InputTokensRequest,
    InputTokensResponse,
    ResponseDeleted,
    ResponseObject,
    ResponsesRequest,
)
from blazr.server.schemas_server import (
    DetokenizeRequest,
    DetokenizeResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
    VersionInfo,
)
from blazr.server.serving import Serving
from blazr.server.state import ServerState
from blazr.server.transport import run_until_disconnect

router = APIRouter()
RequestT = TypeVar("RequestT", bound=BaseModel)


def server_state(request: Request) -> ServerState:
    return request.app.state.blazr


State = Annotated[ServerState, Depends(server_state)]


async def serving(raw: Request, state: State) -> Serving:
    """The loaded model, or 503: loading, draining (SIGTERM), failed (the process is exiting). With a model
    pool: the model the request names, loaded if needed (`pooled`)."""
    if state.pool is not None and state.status == "ready":
        return await pooled(raw, state.pool)
    return loaded(state)


def loaded(state: ServerState) -> Serving:
    """The one loaded model, or 503 (see `serving`)."""
    if state.status == "ready" and state.serving is not None and state.serving.engine.is_alive:
        return state.serving
    if state.status == "loading":
        raise APIError(503, "the model is still loading", code="loading", headers={"Retry-After": "2"})
    if state.status == "draining":
        raise APIError(503, "the server is shutting down", code="shutting_down")
    raise APIError(
        503, f"the server is not available: {state.error or 'the engine stopped'}", code="unavailable"
    )


async def pooled(raw: Request, pool: ModelPool) -> Serving:
    """The model a request names (`model`, or Ollama's `name`; none: the default), acquired until the
    response is complete. A GET or DELETE (stored responses) takes any loaded model: the store is shared."""
    if raw.method != "POST":
        found = pool.any_serving()
        if found is not None:
            return found
        name = None
    else:
        body = await raw.body()
        name = await asyncio.to_thread(_model_field, body) if body else None
    loads = pool.entry(name).num_loads
    t0 = time.perf_counter()
    entry, s = await pool.acquire(name)
    if entry.num_loads != loads:  # this request waited for a load (Ollama's load_duration)
        raw.state.load_seconds = time.perf_counter() - t0
    raw.state.pool_entry = entry
    on_response_done(raw.scope, lambda: pool.release(entry))
    return s


def pool_entry(raw: Request) -> PoolEntry | None:
    """The pool's entry of the model serving this request (None: a one-model server)."""
    return getattr(raw.state, "pool_entry", None)


def _model_field(body: bytes) -> str | None:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name = data.get("model") or data.get("name")  # Ollama's /api/show takes either
    return name if isinstance(name, str) else None


Serving = Annotated[Serving, Depends(serving)]


@router.get("/health", responses=documented(HealthStatus, 503, model_503=HealthStatus))
async def health(state: State) -> JSONResponse:
    if state.status == "ready" and state.pool is not None:
        return JSONResponse({"status": "ok"})
    if state.status == "ready" and state.serving is not None and state.serving.engine.is_alive:
        return JSONResponse({"status": "ok"})
    if state.status in ("loading", "draining"):
        return JSONResponse({"status": state.status}, status_code=503)
    return JSONResponse({"status": "error", "error": state.error or "the engine stopped"}, status_code=503)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus"}},
)
async def metrics(state: State) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/version", responses=documented(VersionInfo))
async def version() -> JSONResponse:
    return JSONResponse({"version": blazr.__version__})


@router.get("/v1/models", responses=documented(ModelList, 401, 503))
async def list_models(state: State) -> JSONResponse:
    if state.pool is not None:
        return JSONResponse(model_cards.pool_models(state.pool).model_dump(exclude_none=True))
    return JSONResponse(loaded(state).models().model_dump(exclude_none=True))


@router.get("/v1/models/{model_id:path}", responses=documented(ModelCard, 401, 404, 503))
async def get_model(model_id: str, state: State) -> JSONResponse:
    if state.pool is not None:
        return JSONResponse(model_cards.pool_card(state.pool, model_id).model_dump(exclude_none=True))
    return JSONResponse(loaded(state).model(model_id).model_dump(exclude_none=True))


async def parse(raw: Request, schema: type[RequestT], s: Serving) -> RequestT:
    """The JSON body, whatever its Content-Type (curl -d sends a form type), validated strictly (off the
    event loop) → 400 naming the field."""
    body = await raw.body()
    try:
        return await s.off_loop(schema.model_validate_json, body or b"null")
    except ValidationError as e:
        message, param = validation_message(list(e.errors()))
        raise APIError(400, message, param=param) from None


GENERATION_ERRORS = (400, 401, 404, 413, 500, 503)


@router.post(
    "/v1/completions",
    openapi_extra=request_body(CompletionRequest),
    responses=documented(CompletionResponse, *GENERATION_ERRORS, stream=True),
)
async def completions(raw: Request, s: Serving) -> Response:
    return await openai_completions.completions(s, await parse(raw, CompletionRequest, s), raw)


@router.post(
    "/v1/chat/completions",
    openapi_extra=request_body(ChatCompletionRequest),
    responses=documented(ChatCompletionResponse, *GENERATION_ERRORS, stream=True),
)
async def chat_completions(raw: Request, s: Serving) -> Response:
    return await openai_chat.chat(s, await parse(raw, ChatCompletionRequest, s), raw)


@router.post(
    "/v1/responses",
    openapi_extra=request_body(ResponsesRequest),
    responses=documented(ResponseObject, *GENERATION_ERRORS, stream=True),
)
async def responses(raw: Request, s: Serving) -> Response:
    return await openai_responses.create(s, await parse(raw, ResponsesRequest, s), raw)


@router.post(
    "/v1/responses/input_tokens",
    openapi_extra=request_body(InputTokensRequest),
    responses=documented(InputTokensResponse, 400, 401, 404, 413, 503),
)
async def response_input_tokens(raw: Request, s: Serving) -> JSONResponse:
    req = await parse(raw, InputTokensRequest, s)
    return JSONResponse(await openai_responses.input_tokens(s, req))


@router.get("/v1/responses/{response_id}", responses=documented(ResponseObject, 401, 404, 503))
async def get_response(response_id: str, s: Serving) -> JSONResponse:
    return JSONResponse(openai_responses.retrieve(s, response_id))


@router.delete("/v1/responses/{response_id}", responses=documented(ResponseDeleted, 401, 404, 503))
async def delete_response(response_id: str, s: Serving) -> JSONResponse:
    return JSONResponse(openai_responses.delete(s, response_id))


@router.post(
    "/v1/embeddings",
    openapi_extra=request_body(embeddings.EmbeddingRequest),
    responses=documented(embeddings.EmbeddingResponse, *GENERATION_ERRORS),
)
async def create_embeddings(raw: Request, s: Serving) -> Response:
    req = await parse(raw, embeddings.EmbeddingRequest, s)
    rid = request_id(raw.scope)
    return await run_until_disconnect(raw, embeddings.create(s, req, rid), rid)


@router.post(
    "/tokenize",
    openapi_extra=request_body(TokenizeRequest, TokenizeChatRequest),
    responses=documented(TokenizeResponse, 400, 401, 404, 413, 503),
)
async def tokenize(raw: Request, s: Serving) -> JSONResponse:
    """A `prompt` (as /v1/completions takes it) or `messages` (as /v1/chat/completions) → its token ids."""
    body = await raw.body()
    schema: type[TokenizeRequest | TokenizeChatRequest] = TokenizeRequest
    if b"messages" in body and "messages" in await s.off_loop(_keys, body):
        schema = TokenizeChatRequest
    req = await parse(raw, schema, s)
    return JSONResponse((await tokenizing.tokenize(s, req)).model_dump())


@router.post(
    "/detokenize",
    openapi_extra=request_body(DetokenizeRequest),
    responses=documented(DetokenizeResponse, 400, 401, 404, 413, 503),
)
async def detokenize(raw: Request, s: Serving) -> JSONResponse:
    req = await parse(raw, DetokenizeRequest, s)
    return JSONResponse((await tokenizing.detokenize(s, req)).model_dump())


def _keys(body: bytes) -> set[str]:
    """The top-level keys of a JSON object body (none when it is not one: `parse` then says why)."""
    try:
        data = json.loads(body)
    except ValueError:
        return set()
    return set(data) if isinstance(data, dict) else set()
