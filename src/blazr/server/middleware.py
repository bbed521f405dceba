"""The server's pure ASGI middlewares (pure, so that streamed responses pass through untouched).

- `RequestContext`: gives every HTTP request an id (`scope["state"]["request_id"]`, echoed in the
  `X-Request-Id` response header; error logs and 5xx messages name it), and counts the /v1 requests whose
  response is not complete yet (a stream counts until its last byte) — what a drain waits on.
- `BodyLimit`: a request body over `max_bytes` → 413 JSON, decided from Content-Length before anything is
  read, else while reading (chunked bodies or a lying Content-Length), before any parsing.
- `ApiKey`: /v1/*, /tokenize, /detokenize and the API docs (/docs, /redoc, /openapi.json) require
  `Authorization: Bearer <key>` (401 JSON otherwise, compared in constant time); /health, /metrics and
  /version stay open for probes.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from typing import Any

from blazr.server.errors import error_response

Scope = dict[str, Any]
DOC_PATHS = ("/docs", "/redoc", "/openapi.json")
GUARDED_PATHS = ("/v1", "/tokenize", "/detokenize", *DOC_PATHS)  # behind the API key, when one is set


def request_id(scope: Scope) -> str:
    """The id RequestContext gave this request ("-" outside it)."""
    return scope.get("state", {}).get("request_id", "-")


class RequestContext:
    def __init__(self, app: Any, on_in_flight: Callable[[int], None]) -> None:
        self.app = app
        self.on_in_flight = on_in_flight

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        counted = scope["path"].startswith("/v1")
        if counted:
            self.on_in_flight(+1)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if counted:
                self.on_in_flight(-1)


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int, on_reject: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    def _reject(self, status: int, message: str) -> Any:
        if self.on_reject is not None:
            self.on_reject(status)
        code = "request_too_large" if status == 413 else None
        return error_response(
            status, message, "invalid_request_error", code=code, headers={"Connection": "close"}
        )

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
                    await self._reject(400, "Content-Length is not a number")(scope, receive, send)
                    return
                if length > limit:
                    await self._reject(413, too_large)(scope, receive, send)
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
                await self._reject(413, too_large)(scope, receive, send)


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
        auth = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
                break
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            await self.app(scope, receive, send)
            return
        if self.on_reject is not None:
            self.on_reject(401)
        message = (
            "Incorrect API key provided" if auth else "Missing API key: send `Authorization: Bearer <key>`"
        )
        response = error_response(
            401,
            message,
            "invalid_request_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)
