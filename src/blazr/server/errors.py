"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

`APIError` is what the serving code raises; `install_error_handlers` maps it, FastAPI's validation errors
(malformed JSON, wrong types → 400) and unknown paths (404) onto that JSON. Anything else a handler raises
is `unexpected_error`'s to answer (middleware.py's `RequestContext` catches it, streaming or not): a
`BlazrError` is the client's input (400, its one line), any other exception a server fault (500: the
traceback is logged under the request id, and only that id is sent). A field the schema does not know is
"unsupported field 'x'".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from blazr.errors import BlazrError
from blazr.server.schemas import ErrorInfo, ErrorResponse

log = logging.getLogger("blazr.server")

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error"}


class APIError(Exception):
    """An error answered to the client as OpenAI error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code, self.headers)

    def payload(self) -> dict[str, Any]:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()


def error_response(
    status: int,
    message: str,
    type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """One line for the first pydantic error: (message, param). Union branch tags are left out of the path."""
    if not errors:
        return "invalid request", None
    err = errors[0]
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    if extra:  # name the unknown field rather than a union branch's complaint about it
        param = ".".join(_path(extra[0]))
        return f"unsupported field '{param}': blazr does not implement it", param
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{': ' + detail if detail else ''}", None
    path = _path(err)
    msg = err.get("msg", "invalid value")
    if not path:
        return f"the request body is invalid: {msg}", None
    param = ".".join(path)
    same_field = [e for e in errors if _path(e)[:1] == path[:1]]
    if len(same_field) > 1 and len(same_field) == len(errors):  # a union: every allowed type failed
        return f"invalid value for '{path[0]}': {msg} (nor any other allowed type)", path[0]
    return f"invalid value for '{param}': {msg}", param


def _path(err: Any) -> list[str]:
    loc = [p for p in err.get("loc", ()) if p != "body"]
    return [
        str(p) for p in loc if isinstance(p, int) or (p[:1].islower() and "[" not in p and p not in _TAGS)
    ]


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal_error"}


def unexpected_error(exc: BaseException, rid: str) -> APIError:
    """The answer to an exception that no handler took (see the module docstring)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, BlazrError):
        return APIError(400, str(exc))
    return APIError(500, f"internal server error (request id {rid})", code="internal_error")


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None] | None = None) -> None:
    """Register the handlers; `on_error(status)` is called for every error answered (metrics)."""

    def note(status: int) -> None:
        if on_error is not None:
            on_error(status)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        note(exc.status)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        note(400)
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        note(exc.status_code)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(exc.status_code, message, kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the last resort, for a fault outside RequestContext (which answers all the others): Starlette
        # re-raises after this, so uvicorn logs it too and closes the connection
        rid = request.scope.get("state", {}).get("request_id", "-")
        error = unexpected_error(exc, rid)
        note(error.status)
        return error.response()
