"""The FastAPI app's error handlers: `APIError`, FastAPI's validation errors (malformed JSON, wrong types →
400), unknown paths and methods (Starlette's HTTP errors) and the last-resort fault, each answered in the
shape of the API the request spoke (errors.py: the shapes, the dialects, what the serving code raises).
Apart from errors.py so that what imports the errors — the command line's chat templates — loads no web
framework."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from blazr.server.errors import APIError, bad_request, dialect_of, unexpected_error, validation_message


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None] | None = None) -> None:
    """Register the handlers; `on_error(status)` is called for every error answered (metrics)."""

    def note(status: int) -> None:
        if on_error is not None:
            on_error(status)

    def answer(request: Request, error: APIError) -> JSONResponse:
        note(error.status)
        rid = request.scope.get("state", {}).get("request_id", "-")
        return error.response(dialect_of(request.url.path), rid)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return answer(request, bad_request(message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        headers = getattr(exc, "headers", None)
        return answer(request, APIError(exc.status_code, message, headers=headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the last resort, for a fault outside RequestContext (which answers all the others): Starlette
        # re-raises after this, so uvicorn logs it too and closes the connection
        rid = request.scope.get("state", {}).get("request_id", "-")
        return answer(request, unexpected_error(exc, rid))
