"""Anthropic's HTTP routes — thin: parse (off the event loop, schemas_anthropic.py), hand over to
anthropic_messages.py, return. Behind the API key (`x-api-key` or `Authorization: Bearer`); errors in
Anthropic's shape (errors.py, by path).

POST /v1/messages (JSON, or Server-Sent Events with `stream`), POST /v1/messages/count_tokens.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from blazr.server import anthropic_messages
from blazr.server.openapi import documented, request_body
from blazr.server.routes import GENERATION_ERRORS, Serving, parse
from blazr.server.schemas_anthropic import (
    AnthropicError,
    CountTokensRequest,
    MessageResponse,
    MessagesRequest,
    TokenCount,
)

router = APIRouter()


@router.post(
    "/v1/messages",
    openapi_extra=request_body(MessagesRequest),
    responses=documented(MessageResponse, *GENERATION_ERRORS, stream=True, error_model=AnthropicError),
)
async def messages(raw: Request, s: Serving) -> Response:
    return await anthropic_messages.create(s, await parse(raw, MessagesRequest, s), raw)


@router.post(
    "/v1/messages/count_tokens",
    openapi_extra=request_body(CountTokensRequest),
    responses=documented(TokenCount, 400, 401, 404, 413, 503, error_model=AnthropicError),
)
async def count_tokens(raw: Request, s: Serving) -> JSONResponse:
    req = await parse(raw, CountTokensRequest, s)
    return JSONResponse(await anthropic_messages.count_tokens(s, req))
