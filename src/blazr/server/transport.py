"""How an answer reaches the client: Server-Sent Events (the chunks' bytes from chunks.py, then
`data: [DONE]\\n\\n`; an error after the first byte as an SSE `error` event before `[DONE]`), a
non-streaming answer raced against the client's disconnect (499, requests aborted), and the API error each
engine-side exception becomes (500 with the request id, or 503 on shutdown)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable

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
from blazr.server.errors import APIError
from blazr.server.protocol import bad_request

log = logging.getLogger("blazr.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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


async def _sse(events: AsyncIterator[bytes], stream: RequestStream, rid: str) -> AsyncIterator[bytes]:
    """SSE framing around `events` (each one or more whole `data:` events, chunks.py); an error after the
    stream started becomes an error event (the openai client raises it), then `[DONE]`. However this
    generator ends (done, cancelled, closed), unfinished requests abort."""
    try:
        async for data in events:
            yield data
    except APIError as e:
        yield _sse_error(e)
    except BlazrError as e:
        yield _sse_error(bad_request(str(e)))
    except Exception as e:
        err = engine_error(e, rid)
        if err is None:  # a bug in this module: logged, and the client still gets a well-formed end
            log.exception("request %s: streaming failed", rid)
            err = APIError(500, f"internal server error (request id {rid})", code="internal_error")
        yield _sse_error(err)
    finally:
        stream.abort()
    yield b"data: [DONE]\n\n"


def _sse_error(error: APIError) -> bytes:
    return b"data: " + json.dumps(error.payload()).encode() + b"\n\n"


def sse_response(events: AsyncIterator[bytes], stream: RequestStream, rid: str) -> StreamingResponse:
    return StreamingResponse(_sse(events, stream, rid), media_type="text/event-stream", headers=SSE_HEADERS)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Awaitable[BaseModel], rid: str) -> Response:
    """Await `work` (a whole response); if the client goes away first, cancel it (which aborts its
    requests) and answer nothing useful (499, nginx's 'client closed request')."""
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
        return Response(body.model_dump_json(), media_type="application/json")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    log.info("request %s: client disconnected; request cancelled", rid)
    return Response(status_code=499)
