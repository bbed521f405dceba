"""API errors with the right HTTP status, in the error shape of the API the request spoke (its dialect):

  openai      `{"error": {"message", "type", "param", "code"}}` (/v1/*, /tokenize, /detokenize, probes)
  anthropic   `{"type": "error", "error": {"type", "message"}, "request_id"}` (/v1/messages*), the error
              type named by the status (invalid_request_error, authentication_error, not_found_error,
              request_too_large, api_error, overloaded_error)
  ollama      `{"error": "message"}` (/api/*)

`APIError` is what the serving code raises (`bad_request` for a client's mistake, naming the field);
error_handlers.py maps it, FastAPI's validation errors (malformed JSON, wrong types → 400) and unknown paths
(404) onto the request's dialect. Anything else a handler raises is `unexpected_error`'s to answer
(middleware.py's `RequestContext` catches it, streaming or not): a `BlazrError` is the client's input (400,
its one line), any other exception a server fault (500: the traceback is logged under the request id, and
only that id is sent). A field the schema does not know is "unsupported field 'x'". Once a stream has
started, an error is one more event in the stream's own framing (`stream_error`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from blazr.errors import BlazrError
from blazr.server.schemas_server import ErrorInfo, ErrorResponse

if TYPE_CHECKING:
    from starlette.responses import JSONResponse

Dialect = Literal["openai", "anthropic", "ollama"]
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error"}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def dialect_of(path: str) -> Dialect:
    """The API a request path belongs to (whose error shape it gets)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


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

    def response(self, dialect: Dialect = "openai", rid: str | None = None) -> JSONResponse:
        """The error as an HTTP response in `dialect`'s shape."""
        # imported here: the command line's generate / chat / info load this module (chat templates raise
        # bad_request) and need no web framework (fastapi and starlette: ~0.5 s of their start)
        from starlette.responses import JSONResponse

        return JSONResponse(self.payload(dialect, rid), status_code=self.status, headers=self.headers)

    def payload(self, dialect: Dialect = "openai", rid: str | None = None) -> dict[str, Any]:
        """The error body in `dialect`'s shape (`rid`: the request id Anthropic's shape carries)."""
        if dialect == "ollama":
            return {"error": self.message}
        if dialect == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": self.message}}
            return {**body, "request_id": rid} if rid else body
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A client's mistake (400), naming the field."""
    return APIError(400, message, param=param, code=code)


Framing = Literal["openai", "responses", "anthropic", "ollama"]


def framing_of(path: str) -> Framing:
    """How a path's streams are framed (what its last, error event looks like)."""
    if path.startswith("/v1/responses"):
        return "responses"
    return dialect_of(path)


def stream_error(error: APIError, framing: Framing, rid: str | None = None) -> bytes:
    """The last bytes of a stream that failed after it started, in its API's framing: an SSE `error` event
    then `data: [DONE]` (chat / completions), an `error` event (Responses: `type`, `code`, `message`,
    `param`; Anthropic: its error shape), or an NDJSON `{"error": …}` line (Ollama)."""
    if framing == "ollama":
        return json.dumps(error.payload("ollama")).encode() + b"\n"
    if framing == "anthropic":
        return b"event: error\ndata: " + json.dumps(error.payload("anthropic", rid)).encode() + b"\n\n"
    if framing == "responses":
        body = {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        return b"event: error\ndata: " + json.dumps({**body, "sequence_number": 0}).encode() + b"\n\n"
    return b"data: " + json.dumps(error.payload()).encode() + b"\n\ndata: [DONE]\n\n"


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
