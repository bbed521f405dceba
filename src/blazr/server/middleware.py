"""The server's pure ASGI middlewares (pure, so that streamed responses pass through untouched).

- `RequestContext`: gives every HTTP request an id (`scope["state"]["request_id"]`, echoed in the
  `X-Request-Id` response header; error logs and 5xx messages name it), counts the /v1 requests whose
  response is not complete yet (a stream counts until its last byte) — what a drain waits on —, runs the
  request's `on_response_done` callbacks when it is (a model pool's release), and is
  where an exception that no handler took ends (`unexpected_error`): it is logged once and answered as
  error JSON in the request's API dialect (500, or 400 for a BlazrError), or, when a stream had already
  started, as that stream's own error event (errors.py `stream_error`) — never left to uvicorn, which
  would log it again and drop the keep-alive connection. (FastAPI's own `Exception` handler cannot do
  this: Starlette re-raises after it.)
- `BodyLimit`: a request body over `max_bytes` → 413 JSON, decided from Content-Length before anything is
  read, else while reading (chunked bodies or a lying Content-Length), before any parsing.
- `ApiKey`: /v1/* (OpenAI's and Anthropic's routes), Ollama's /api/*, /tokenize, /detokenize and the API
  docs (/docs, /redoc, /openapi.json) require the key as `Authorization: Bearer <key>` or Anthropic's
  `x-api-key: <key>` (401 in the route's error shape otherwise, compared in constant time); /health,
  /metrics and /version stay open for probes.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect

from blazr.server.errors import APIError, dialect_of, framing_of, stream_error, unexpected_error

log = logging.getLogger("blazr.server")

Scope = dict[str, Any]
DOC_PATHS = ("/docs", "/redoc", "/openapi.json")
GUARDED_PATHS = ("/v1", "/api/", "/tokenize", "/detokenize", *DOC_PATHS)  # behind the API key, if set
STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson")


def on_response_done(scope: Scope, callback: Callable[[], None]) -> None:
    """Call `callback` once this request's response is complete (a stream: after its last byte), or it
    failed or its client left (RequestContext runs it; a model pool releases the model so)."""
    scope.setdefault("state", {}).setdefault("on_response_done", []).append(callback)


def request_id(scope: Scope) -> str:
    """The id RequestContext gave this request ("-" outside it)."""
    return scope.get("state", {}).get("request_id", "-")


class RequestContext:
    def __init__(
        self, app: Any, on_in_flight: Callable[[int], None], on_error: Callable[[int], None] | None = None
    ) -> None:
        self.app = app
        self.on_in_flight = on_in_flight
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())
        sent = {"start": False, "sse": False, "end": False}

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
                sent["start"] = True
                sent["sse"] = any(
                    k.lower() == b"content-type" and v.startswith(STREAM_TYPES) for k, v in message["headers"]
                )
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent["end"] = True
            await send(message)

        counted = scope["path"].startswith(("/v1", "/api/"))
        if counted:
            self.on_in_flight(+1)
        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            log.info("request %s: client disconnected", rid)
        except Exception as exc:
            await self._answer(exc, scope, receive, send_with_id, sent)
        finally:
            if counted:
                self.on_in_flight(-1)
            for callback in scope["state"].pop("on_response_done", []):
                callback()

    async def _answer(
        self, exc: Exception, scope: Scope, receive: Any, send: Any, sent: dict[str, bool]
    ) -> None:
        """Log `exc` once and answer it as well as what was already sent allows."""
        rid = request_id(scope)
        error = unexpected_error(exc, rid)
        if error.status >= 500:
            log.error(
                "request %s: unhandled error in %s %s", rid, scope["method"], scope["path"], exc_info=exc
            )
        else:
            log.info("request %s: %d %s", rid, error.status, error.message)
        if self.on_error is not None:
            self.on_error(error.status)
        try:
            if not sent["start"]:
                await error.response(dialect_of(scope["path"]), rid)(scope, receive, send)
            elif sent["sse"] and not sent["end"]:
                event = stream_error(error, framing_of(scope["path"]), rid)
                await send({"type": "http.response.body", "body": event, "more_body": False})
        except (OSError, ClientDisconnect):  # the client has gone: no one to answer
            log.info("request %s: client disconnected before the error was sent", rid)
        # else: a response was complete (nothing to add), or a non-SSE one was cut short (no well-formed
        # end exists: uvicorn closes the connection). blazr streams only SSE and NDJSON.


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int, on_reject: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    def _reject(self, status: int, message: str, path: str) -> Any:
        if self.on_reject is not None:
            self.on_reject(status)
        code = "request_too_large" if status == 413 else None
        error = APIError(status, message, code=code, headers={"Connection": "close"})
        return error.response(dialect_of(path))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        too_large = f"the request body is larger than {limit} bytes (--max-request-bytes)"
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await self._reject(400, "Content-Length is not a number", scope["path"])(
                        scope, receive, send
                    )
                    return
                if length > limit:
                    await self._reject(413, too_large, scope["path"])(scope, receive, send)
                    return
        received = 0
        started = False

        async def counting_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(413, too_large, scope["path"])(scope, receive, send)


class ApiKey:
    def __init__(self, app: Any, api_key: str, on_reject: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.key = api_key.encode()
        self.on_reject = on_reject

    @staticmethod
    def _guarded(scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            return False
        return scope["path"].startswith(GUARDED_PATHS)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        keys = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                keys.append(token.strip() if scheme.lower() == b"bearer" else b"\0")
            elif name == b"x-api-key":  # Anthropic's header
                keys.append(value.strip())
        if any(hmac.compare_digest(k, self.key) for k in keys):
            await self.app(scope, receive, send)
            return
        if self.on_reject is not None:
            self.on_reject(401)
        message = (
            "Incorrect API key provided"
            if keys
            else "Missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)"
        )
        error = APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await error.response(dialect_of(scope["path"]))(scope, receive, send)
