"""HTTP routes — thin: parse (FastAPI + schemas.py), hand over to `OpenAIServing`, return.

Open:       GET /health (200 ready, 503 loading or failed), GET /metrics (Prometheus), GET /version.
/v1/* (behind the API key when one is set; 503 + Retry-After while the model loads):
            GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

import blazr
from blazr.server.errors import APIError, validation_message
from blazr.server.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from blazr.server.serving import OpenAIServing
from blazr.server.state import ServerState

router = APIRouter()
RequestT = TypeVar("RequestT", bound=BaseModel)


def server_state(request: Request) -> ServerState:
    return request.app.state.blazr


State = Annotated[ServerState, Depends(server_state)]


def serving(state: State) -> OpenAIServing:
    """The loaded model, or 503 while it loads (500 if loading failed or the engine stopped)."""
    if state.serving is not None and state.serving.engine.is_alive:
        return state.serving
    if state.status == "loading":
        raise APIError(503, "the model is still loading", code="loading", headers={"Retry-After": "2"})
    raise APIError(500, f"the model is not available: {state.error or 'engine stopped'}", code="engine_error")


Serving = Annotated[OpenAIServing, Depends(serving)]


@router.get("/health")
async def health(state: State) -> JSONResponse:
    ok = state.serving is not None and state.serving.engine.is_alive
    if ok:
        return JSONResponse({"status": "ok"})
    status = "loading" if state.status == "loading" else "error"
    body: dict[str, str] = {"status": status}
    if status == "error":
        body["error"] = state.error or "engine stopped"
    return JSONResponse(body, status_code=503)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": blazr.__version__})


@router.get("/v1/models")
async def list_models(s: Serving) -> ModelList:
    return s.models()


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, s: Serving) -> ModelCard:
    return s.model(model_id)


async def parse(raw: Request, schema: type[RequestT]) -> RequestT:
    """The JSON body, whatever its Content-Type (curl -d sends a form type), validated strictly → 400."""
    body = await raw.body()
    try:
        return schema.model_validate_json(body or b"null")
    except ValidationError as e:
        message, param = validation_message(list(e.errors()))
        raise APIError(400, message, param=param) from None


@router.post("/v1/completions")
async def completions(raw: Request, s: Serving) -> Response:
    return await s.completions(await parse(raw, CompletionRequest), raw)


@router.post("/v1/chat/completions")
async def chat_completions(raw: Request, s: Serving) -> Response:
    return await s.chat(await parse(raw, ChatCompletionRequest), raw)
