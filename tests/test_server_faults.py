"""A fault inside a request handler, through a real uvicorn (in this process, the scripted engine of
test_server_app behind the real app): the client gets OpenAI error JSON — 500 for a server fault, 400 for a
BlazrError — or, once an SSE stream has started, an `error` event then `data: [DONE]`; the fault is logged
once (by blazr, never as uvicorn's "Exception in ASGI application"); and the keep-alive connection stays
open, so the next request on the same socket is answered."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.responses import StreamingResponse

from blazr.distributed.worker import free_port
from blazr.errors import BlazrError
from blazr.server import openai_chat
from blazr.server.app import LoadedModel, build_app
from blazr.server.openai_chat import ChatJob
from blazr.server.options import ServerConfig
from tests.test_server_app import FakeEngine, FakeTokenizer

SECRET = "/internal/secret/path.py"  # in every injected fault's text: it must never reach a client
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class _Server:
    """The real app behind uvicorn on a free loopback port, in a thread."""

    def __init__(self) -> None:
        engine = FakeEngine()

        def loader(cfg: ServerConfig) -> LoadedModel:
            return LoadedModel(engine, FakeTokenizer(), ["fake"], "fake-model")  # type: ignore[arg-type]

        self.port = free_port()
        config = uvicorn.Config(
            build_app(ServerConfig(), loader),
            host="127.0.0.1",
            port=self.port,
            log_config=None,  # uvicorn's loggers propagate to caplog
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.server.started:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return self
                conn.close()
            time.sleep(0.02)
        raise AssertionError("the server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def live() -> Iterator[_Server]:
    with _Server() as server:
        yield server


class _Connection:
    """One keep-alive HTTP/1.1 connection: every request must go over the same socket."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.connect()
        self.sock = self.conn.sock

    def post(self, body: dict[str, Any]) -> tuple[int, str, bytes]:
        """(status, content type, body) of one request; fails if the socket was closed or replaced."""
        dropped = "the server closed the keep-alive connection"
        try:
            self.conn.request(
                "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
            )
            r = self.conn.getresponse()
            data = r.read()
        except (http.client.HTTPException, ConnectionError) as e:
            raise AssertionError(f"{dropped}: {e!r}") from None
        assert self.conn.sock is self.sock and not r.will_close, dropped
        return r.status, r.getheader("content-type", ""), data

    def close(self) -> None:
        self.conn.close()


def _error(status: int, ctype: str, data: bytes, expected: int) -> dict[str, Any]:
    assert status == expected, data
    assert ctype.startswith("application/json")
    assert SECRET.encode() not in data
    return json.loads(data)["error"]


def _sse(status: int, ctype: str, data: bytes) -> list[Any]:
    """The stream's events (`[DONE]` as the string)."""
    assert status == 200 and ctype.startswith("text/event-stream"), data
    assert SECRET.encode() not in data
    events = [line[len("data: ") :] for line in data.decode().split("\n\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _fault(*_: object, **__: object) -> Any:
    raise RuntimeError(f"injected fault in {SECRET}")


def _uvicorn_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn") and r.levelno >= 40]


def _blazr_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "blazr.server" and r.levelno >= logging.ERROR]


def test_a_fault_before_the_answer_is_a_json_500_on_a_kept_alive_connection(live, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    conn = _Connection(live.port)
    try:
        assert conn.post(CHAT)[0] == 200
        monkeypatch.setattr(openai_chat, "conversation", _fault)
        for stream in (False, True):  # a stream that never started answers JSON too
            error = _error(*conn.post({**CHAT, "stream": stream}), 500)
            assert error["type"] == "server_error" and error["code"] == "internal_error"
            assert "request id" in error["message"]
        monkeypatch.undo()
        status, _, data = conn.post(CHAT)
        assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "xxx"
    finally:
        conn.close()
    faults = _blazr_errors(caplog)
    assert len(faults) == 2, [r.getMessage() for r in faults]  # once each
    assert all(r.exc_info and SECRET in str(r.exc_info[1]) for r in faults)  # with the traceback
    assert _uvicorn_errors(caplog) == []


def test_a_blazr_error_escaping_a_handler_is_a_400(live, monkeypatch, caplog):
    caplog.set_level(logging.INFO)

    def bad_input(*_: object, **__: object) -> Any:
        raise BlazrError("messages: the template cannot render this conversation")

    conn = _Connection(live.port)
    try:
        monkeypatch.setattr(openai_chat, "conversation", bad_input)
        error = _error(*conn.post(CHAT), 400)
        assert error["type"] == "invalid_request_error"
        assert error["message"] == "messages: the template cannot render this conversation"
        monkeypatch.undo()
        assert conn.post(CHAT)[0] == 200
    finally:
        conn.close()
    assert _blazr_errors(caplog) == [] and _uvicorn_errors(caplog) == []


async def _first_then_fault(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for data in events:
        yield data
        raise RuntimeError(f"injected fault in {SECRET}")


@pytest.mark.parametrize("where", ["events", "response"])
def test_a_fault_after_a_stream_started_ends_it_with_an_error_event(live, monkeypatch, caplog, where):
    """`events`: the chat job's event generator fails (transport's SSE framing catches it); `response`:
    the streamed response itself fails outside that framing (the request middleware catches it)."""
    caplog.set_level(logging.INFO)
    if where == "events":
        events = ChatJob.events
        monkeypatch.setattr(ChatJob, "events", lambda job: _first_then_fault(events(job)))
    else:

        def unframed(events: AsyncIterator[bytes], stream: Any, rid: str) -> StreamingResponse:
            return StreamingResponse(_first_then_fault(events), media_type="text/event-stream")

        monkeypatch.setattr(openai_chat, "sse_response", unframed)
    conn = _Connection(live.port)
    try:
        got = _sse(*conn.post({**CHAT, "stream": True}))
        assert got[-1] == "[DONE]"
        assert got[0]["object"] == "chat.completion.chunk"  # what was sent before the fault
        error = got[-2]["error"]
        assert error["type"] == "server_error" and "request id" in error["message"]
        monkeypatch.undo()
        got = _sse(*conn.post({**CHAT, "stream": True}))
        assert got[-1] == "[DONE]" and "error" not in got[-2]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in got[:-1] if c["choices"]) == "xxx"
    finally:
        conn.close()
    assert len(_blazr_errors(caplog)) == 1
    assert _uvicorn_errors(caplog) == []
