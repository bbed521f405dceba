"""Ollama's HTTP routes — thin: parse (off the event loop, schemas_ollama.py), hand over to ollama_api.py,
return. Behind the API key when one is set (the ollama client sends `OLLAMA_API_KEY` as a Bearer token);
errors are Ollama's `{"error": "…"}` (errors.py, by path).

GET /api/version, GET /api/tags, GET /api/ps, POST /api/show, POST /api/chat and POST /api/generate (NDJSON
streams unless `"stream": false`), POST /api/embed, POST /api/embeddings.

With several models (model_pool.py): /api/tags lists them all, /api/ps the loaded ones, and a request's
`keep_alive` sets how long its model stays loaded once idle (0: unloaded when the request is done).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from blazr.server import model_cards, ollama_api
from blazr.server.errors import bad_request
from blazr.server.middleware import request_id
from blazr.server.openapi import documented, request_body
from blazr.server.routes import Serving, State, loaded, parse, pool_entry
from blazr.server.schemas_ollama import (
    ChatRequest,
    ChatResponse,
    EmbeddingResponse,
    EmbeddingsRequest,
    EmbedRequest,
    EmbedResponse,
    GenerateRequest,
    GenerateResponse,
    ModelList,
    OllamaError,
    ShowRequest,
    ShowResponse,
    VersionResponse,
)
from blazr.server.transport import run_until_disconnect

router = APIRouter()
ERRORS = (400, 401, 404, 413, 500, 503)


def _doc(model: type, *statuses: int, stream: bool = False) -> dict:
    return documented(
        model, *statuses, stream=stream, error_model=OllamaError, stream_type="application/x-ndjson"
    )


@router.get("/api/version", responses=_doc(VersionResponse, 401, 503))
async def version(state: State) -> JSONResponse:
    if state.pool is None:
        loaded(state)  # 503 while the one model loads
    return JSONResponse(ollama_api.version())


@router.get("/api/tags", responses=_doc(ModelList, 401, 503))
async def tags(state: State) -> JSONResponse:
    if state.pool is not None:
        return JSONResponse(model_cards.pool_tags(state.pool))
    return JSONResponse(ollama_api.tags(loaded(state)))


@router.get("/api/ps", responses=_doc(ModelList, 401, 503))
async def ps(state: State) -> JSONResponse:
    if state.pool is not None:
        return JSONResponse(model_cards.pool_ps(state.pool))
    return JSONResponse(ollama_api.ps(loaded(state)))


def _keep_alive(raw: Request, value: float | str | None) -> None:
    """A multi-model server: how long this request's model stays loaded once idle (Ollama's keep_alive; a
    value that is no duration is a 400). One model loaded at startup: accepted with no effect."""
    entry = pool_entry(raw)
    seconds = ollama_api.keep_alive_seconds(value) if entry is not None else None
    if entry is not None and seconds is not None:
        entry.keep_alive = seconds


@router.post(
    "/api/show",
    openapi_extra=request_body(ShowRequest),
    responses=_doc(ShowResponse, 400, 401, 404, 413, 503),
)
async def show(raw: Request, s: Serving) -> JSONResponse:
    req = await parse(raw, ShowRequest, s)
    name = req.model or req.name
    if name is None:
        raise bad_request("model is required", "model")
    return JSONResponse(ollama_api.show(s, name))


@router.post(
    "/api/chat", openapi_extra=request_body(ChatRequest), responses=_doc(ChatResponse, *ERRORS, stream=True)
)
async def chat(raw: Request, s: Serving) -> Response:
    req = await parse(raw, ChatRequest, s)
    _keep_alive(raw, req.keep_alive)
    return await ollama_api.chat(s, req, raw)


@router.post(
    "/api/generate",
    openapi_extra=request_body(GenerateRequest),
    responses=_doc(GenerateResponse, *ERRORS, stream=True),
)
async def generate(raw: Request, s: Serving) -> Response:
    req = await parse(raw, GenerateRequest, s)
    _keep_alive(raw, req.keep_alive)
    return await ollama_api.generate(s, req, raw)


@router.post("/api/embed", openapi_extra=request_body(EmbedRequest), responses=_doc(EmbedResponse, *ERRORS))
async def embed(raw: Request, s: Serving) -> Response:
    req = await parse(raw, EmbedRequest, s)
    _keep_alive(raw, req.keep_alive)
    rid = request_id(raw.scope)
    return await run_until_disconnect(raw, ollama_api.embed(s, req, rid), rid)


@router.post(
    "/api/embeddings",
    openapi_extra=request_body(EmbeddingsRequest),
    responses=_doc(EmbeddingResponse, *ERRORS),
)
async def embeddings(raw: Request, s: Serving) -> Response:
    req = await parse(raw, EmbeddingsRequest, s)
    rid = request_id(raw.scope)
    return await run_until_disconnect(raw, ollama_api.embeddings_legacy(s, req, rid), rid)
