"""How an answer reaches the client: a stream in its API's framing (OpenAI's SSE chunks then
`data: [DONE]\\n\\n`; the Responses API's and Anthropic's named SSE events; Ollama's NDJSON lines) whose
error after the first byte is one more event in that framing (errors.py `stream_error`), a non-streaming
answer raced against the client's disconnect (499, requests aborted), and the API error each engine-side
exception becomes (500 with the request id, or 503 on shutdown)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from blazr.engine.async_engine import (
    EngineDeadError,
    RequestCancelledError,
    RequestFailedError,
    RequestStream,
)
from blazr.errors import BlazrError
from blazr.server.errors import APIError, Framing, bad_request, stream_error

log = logging.getLogger("blazr.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MEDIA_TYPES = {
    "openai": "text/event-stream",
    "responses": "text/event-stream",
    "anthropic": "text/event-stream",
    "ollama": "application/x-ndjson",
}


def engine_error(error: BaseException, rid: str) -> APIError | None:
    """The API error for an exception the engine side raised into a request, None for any other."""
    if isinstance(error, RequestFailedError):
        return APIError(
            500,
            f"internal error while generating (request id {rid}); the server logged the details",
            code="internal_error",
        )
    if isinstance(error, RequestCancelledError):
        return APIError(503, "the server is shutting down", code="shutting_down")
    if isinstance(error, EngineDeadError):
        return APIError(500, f"the engine has stopped (request id {rid})", code="engine_error")
    return None


async def _framed(
    events: AsyncIterator[bytes], stream: RequestStream | None, rid: str, framing: Framing
) -> AsyncIterator[bytes]:
    """`events` (each one or more whole events) in their framing; an error after the stream started becomes
    that framing's error event (the clients raise it), and OpenAI's chunk streams end with `[DONE]`.
    However this generator ends (done, cancelled, closed), unfinished requests abort."""
    try:
        async for data in events:
            yield data
    except Exception as e:
        if isinstance(e, APIError):
            err = e
        elif isinstance(e, BlazrError):
            err = bad_request(str(e))
        else:
            err = engine_error(e, rid)  # type: ignore[assignment]
        if err is None:  # a bug in this module: logged, and the client still gets a well-formed end
            log.exception("request %s: streaming failed", rid)
            err = APIError(500, f"internal server error (request id {rid})", code="internal_error")
        yield stream_error(err, framing, rid)
        return
    finally:
        if stream is not None:
            stream.abort()
    if framing == "openai":
        yield b"data: [DONE]\n\n"


def sse_response(
    events: AsyncIterator[bytes], stream: RequestStream | None, rid: str, framing: Framing = "openai"
) -> StreamingResponse:
    """A streamed answer: `events` in `framing` (SSE, or NDJSON for Ollama)."""
    return StreamingResponse(
        _framed(events, stream, rid, framing), media_type=MEDIA_TYPES[framing], headers=SSE_HEADERS
    )


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(
    request: Request, work: Awaitable[BaseModel | dict[str, Any]], rid: str
) -> Response:
    """Await `work` (a whole response: a model, or a JSON object); if the client goes away first, cancel it
    (which aborts its requests) and answer nothing useful (499, nginx's 'client closed request')."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        try:
            body = task.result()
        except Exception as e:
            err = engine_error(e, rid)
            if err is None:
                raise
            raise err from None
        text = body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body, ensure_ascii=False)
        return Response(text, media_type="application/json")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    log.info("request %s: client disconnected; request cancelled", rid)
    return Response(status_code=499)
