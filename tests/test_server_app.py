"""The server app in-process with a scripted fake engine: loading states, load failure, an engine crash,
a failed request, the API-key guard, the body limit, the OpenAPI document, abort on early close and error
formatting — the paths a real model cannot trigger on demand. (End-to-end behaviour with real models is in
test_server*.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from blazr.chat_template import ChatTemplate
from blazr.engine.async_engine import AsyncEngine, EngineRequest, RequestFailedError
from blazr.engine.failures import QueueFullError
from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.errors import BlazrError
from blazr.server.app import LoadedModel, build_app
from blazr.server.errors import validation_message
from blazr.server.options import ServerConfig
from blazr.server.schemas import CompletionRequest

CRASH = 666  # a prompt holding this token id makes the fake engine's step raise (the loop dies)
FAIL = 667  # a prompt holding this token id makes the fake engine fail that request alone


@dataclass
class _Cfg:
    max_model_len: int = 64
    max_waiting: int = 4
    max_num_seqs: int = 4


class FakeEngine:
    """LLMEngine's surface, scripted: every step emits one 'x' per request until max_tokens."""

    vocab_size = 1000
    speculator = None  # no speculative decoding

    def __init__(self) -> None:
        self.cfg = _Cfg()
        self.active: dict[str, tuple[list[int], SamplingParams, int]] = {}
        self.aborted: list[str] = []
        self.stalled = False  # steps make no progress (requests stay unfinished)

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) + params.max_tokens > self.cfg.max_model_len:
            raise BlazrError(f"too long: {len(prompt_ids)} + {params.max_tokens} > {self.cfg.max_model_len}")

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.active[rid] = (prompt_ids, params, 0)

    def abort_request(self, rid: str) -> list[SeqOutput]:
        if self.active.pop(rid, None) is None:
            return []
        self.aborted.append(rid)
        return [SeqOutput(rid, 0, [], "", [], True, "abort", 1, 0)]

    def has_unfinished(self) -> bool:
        return bool(self.active)

    def step(self) -> list[SeqOutput]:
        if self.stalled:
            threading.Event().wait(0.002)
            return []
        outs = []
        for rid, (ids, params, done) in list(self.active.items()):
            if CRASH in ids:
                raise RuntimeError("boom /secret/path")
            if FAIL in ids:
                del self.active[rid]
                outs.append(SeqOutput(rid, 0, [], "", [], True, "error", len(ids), 0, error=ValueError("x")))
                continue
            done += 1
            finished = done >= params.max_tokens
            outs += self._outputs(rid, ids, params, done, finished)
            if finished:
                del self.active[rid]
            else:
                self.active[rid] = (ids, params, done)
        threading.Event().wait(0.002)
        return outs

    def _outputs(
        self, rid: str, ids: list[int], params: SamplingParams, done: int, finished: bool
    ) -> list[SeqOutput]:
        """What one step emits for a request: one token "x"."""
        return [SeqOutput(rid, 0, [120], "x", [], finished, "length" if finished else None, len(ids), done)]

    num_running = property(lambda self: len(self.active))
    num_waiting = property(lambda self: 0)
    cache_usage = property(lambda self: 0.0)
    prefix_cache_queries = 0
    prefix_cache_hits = 0


class FakeTokenizer:
    chat_template = ChatTemplate.fallback("chatml")
    special_tokens: dict[str, int] = {}  # noqa: RUF012 - never mutated

    def max_token_chars(self) -> int:
        return 1

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def encode_ordinary(self, text: str) -> list[int]:
        return self.encode(text)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, **kw: object
    ) -> list[int]:
        return self.encode("".join(str(m["content"]) for m in messages))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def token_text(self, token_id: int) -> str:
        return chr(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        return chr(token_id).encode()


def _app(
    gate: threading.Event | None = None,
    fail: Exception | None = None,
    api_key: str | None = None,
    on_fatal: list[BaseException] | None = None,
    **config: object,
):
    engine = FakeEngine()

    def loader(cfg: ServerConfig) -> LoadedModel:
        if gate is not None:
            gate.wait(30)
        if fail is not None:
            raise fail
        return LoadedModel(engine, FakeTokenizer(), ["fake"], "fake-model")  # type: ignore[arg-type]

    fatal = on_fatal.append if on_fatal is not None else None
    return build_app(ServerConfig(api_key=api_key, **config), loader, on_engine_fatal=fatal), engine


def _wait_ready(client: TestClient) -> None:
    for _ in range(500):
        if client.get("/health").status_code == 200:
            return
        threading.Event().wait(0.01)
    raise AssertionError("not ready")


def test_health_503_while_loading_then_200():
    gate = threading.Event()
    app, _ = _app(gate)
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = client.get("/v1/models")
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["error"]["code"] == "loading"
        gate.set()
        _wait_ready(client)
        assert client.get("/v1/models").json()["data"][0]["id"] == "fake"
        body = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json()
        assert body["choices"][0]["text"] == "xxx" and body["usage"]["completion_tokens"] == 3


def test_load_failure_is_reported():
    app, _ = _app(fail=BlazrError("no such checkpoint /home/me/model"))
    failures: list[str] = []
    app.state.blazr.on_load_failed.append(failures.append)
    with TestClient(app) as client:
        for _ in range(500):
            if app.state.blazr.status == "failed":
                break
            threading.Event().wait(0.01)
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "error"
        r = client.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert "/home/me" not in client.get("/health").text + r.text  # no path reaches clients
    assert failures == ["no such checkpoint /home/me/model"]  # the serve loop prints it and exits


def test_engine_crash_fails_open_streams_and_calls_on_fatal():
    fatal: list[BaseException] = []
    app, _ = _app(on_fatal=fatal)
    with TestClient(app) as client:
        _wait_ready(client)
        stream = client.post("/v1/completions", json={"prompt": [1, CRASH], "max_tokens": 5, "stream": True})
        events = [e for e in stream.text.split("\n\n") if e]
        assert '"engine_error"' in events[-2] and events[-1] == "data: [DONE]"
        assert "boom" not in stream.text and "/secret" not in stream.text  # no internal text
        deadline = time.monotonic() + 10  # on_fatal runs on the engine thread after the streams are failed
        while not fatal and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [type(e) for e in fatal] == [RuntimeError]  # serve() exits non-zero on this
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 503 and "boom" not in r.text
        assert client.get("/health").status_code == 503


def test_a_failed_request_is_500_with_its_id_and_the_rest_go_on():
    app, _ = _app()
    with TestClient(app) as client:
        _wait_ready(client)
        r = client.post("/v1/completions", json={"prompt": [1, FAIL], "max_tokens": 5})
        rid = r.headers["x-request-id"]
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        assert rid in r.json()["error"]["message"]
        stream = client.post("/v1/completions", json={"prompt": [FAIL], "max_tokens": 5, "stream": True})
        events = [e for e in stream.text.split("\n\n") if e]
        assert '"internal_error"' in events[-2] and events[-1] == "data: [DONE]"
        ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "xxx"
        assert client.get("/health").status_code == 200


def test_api_key_guards_v1_and_docs_only():
    app, _ = _app(api_key="secret")
    with TestClient(app) as client:
        _wait_ready(client)
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
        for path in ("/v1/models", "/docs", "/openapi.json", "/redoc"):
            assert client.get(path).status_code == 401, path
        for path in ("/tokenize", "/detokenize"):
            assert client.post(path, json={}).status_code == 401, path
        assert client.get("/openapi.json", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Basic secret"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert client.get("/v1/models", headers={"authorization": "bearer secret"}).status_code == 200


@contextlib.asynccontextmanager
async def _running(engine: FakeEngine) -> AsyncIterator[AsyncEngine]:
    """An AsyncEngine over `engine`, started, shut down on leaving."""
    async_engine = AsyncEngine(engine)  # type: ignore[arg-type]
    async_engine.start()
    try:
        yield async_engine
    finally:
        async_engine.shutdown()


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait for the engine thread to make `condition` true (asserted after `seconds`)."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    assert condition()


def test_closing_a_stream_early_aborts_its_requests():
    engine = FakeEngine()

    async def go() -> None:
        async with _running(engine) as async_engine:
            params = SamplingParams(max_tokens=50)
            stream = await async_engine.generate(
                [EngineRequest("a", [1], params), EngineRequest("b", [2], params)]
            )
            it = stream.__aiter__()
            await it.__anext__()
            await it.aclose()
            await _until(lambda: sorted(engine.aborted) == ["a", "b"])
            with pytest.raises(BlazrError, match="too long"):
                await async_engine.generate([EngineRequest("c", [1] * 60, params)])

    asyncio.run(go())


def test_stream_batches_hold_whole_steps_and_an_error_comes_after_the_outputs_before_it():
    """A reader that falls behind gets everything delivered so far in one batch (the server writes it at
    once), in the engine's order; a request's failure is raised after the outputs that preceded it."""
    engine = FakeEngine()

    async def go() -> None:
        async with _running(engine) as async_engine:
            params = SamplingParams(max_tokens=4)
            stream = await async_engine.generate([EngineRequest(r, [1], params) for r in "abc"])
            await asyncio.sleep(0.2)  # the engine finishes all four steps (2 ms each) meanwhile
            batches = [batch async for batch in stream.batches()]
            assert len(batches) == 1 and len(batches[0]) == 12
            for r in "abc":
                mine = [o for o in batches[0] if o.request_id == r]
                assert [o.num_output_tokens for o in mine] == [1, 2, 3, 4] and mine[-1].finished

            stream = await async_engine.generate(
                [EngineRequest("d", [1], SamplingParams(max_tokens=50)), EngineRequest("e", [FAIL], params)]
            )
            it = stream.batches().__aiter__()  # d's first token and e's failure came in one step
            first = await it.__anext__()
            assert [(o.request_id, o.num_output_tokens) for o in first] == [("d", 1)]
            with pytest.raises(RequestFailedError):
                await it.__anext__()
            await _until(lambda: "d" in engine.aborted)  # the rest of the failed group is aborted

    asyncio.run(go())


def test_validation_messages_name_the_field():
    from pydantic import ValidationError

    def first(body: str) -> tuple[str, str | None]:
        with pytest.raises(ValidationError) as err:
            CompletionRequest.model_validate_json(body)
        return validation_message(list(err.value.errors()))

    assert first('{"prompt": "x", "temperature": "hot"}')[1] == "temperature"
    msg, param = first('{"prompt": [1, "a"]}')
    assert param == "prompt" and "other allowed type" in msg
    msg, param = first('{"prompt": ')
    assert param is None and "JSON" in msg
    assert first('{"max_tokens": 3}') == ("invalid value for 'prompt': Field required", "prompt")
    assert (
        first('{"prompt": "x", "stream_options": {"include_usage": 1}}')[1] == "stream_options.include_usage"
    )


def test_serve_flags_and_env_key(monkeypatch):
    from blazr.cli import build_parser

    args = build_parser().parse_args(["serve"])
    monkeypatch.delenv("BLAZR_API_KEY", raising=False)
    cfg = ServerConfig.from_args(args)
    assert (cfg.host, cfg.port, cfg.api_key, cfg.engine.max_num_seqs, cfg.engine.max_waiting) == (
        "0.0.0.0",
        8080,
        None,
        16,
        256,
    )
    monkeypatch.setenv("BLAZR_API_KEY", "from-env")
    assert ServerConfig.from_args(args).api_key == "from-env"
    args = build_parser().parse_args(
        ["serve", "--api-key", "flag", "--served-model-name", "a", "b", "--max-waiting", "2", "--port", "9"]
    )
    cfg = ServerConfig.from_args(args)
    assert (cfg.api_key, cfg.served_model_names, cfg.engine.max_waiting, cfg.port) == (
        "flag",
        ("a", "b"),
        2,
        9,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-num-seqs", "0"])


def test_body_limit_413_before_and_while_reading():
    app, _ = _app(max_request_bytes=1000)
    with TestClient(app) as client:
        _wait_ready(client)
        big = {"prompt": "x" * 2000, "max_tokens": 1}
        r = client.post("/v1/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert "1000" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted while reading
            yield b'{"prompt": "'
            for _ in range(30):
                yield b"y" * 100
            yield b'", "max_tokens": 1}'

        r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        ok = client.post("/v1/completions", json={"prompt": "x" * 50, "max_tokens": 1})
        assert ok.status_code == 200


def test_unknown_and_unsupported_fields_are_400_naming_them():
    app, _ = _app()
    with TestClient(app) as client:
        _wait_ready(client)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        cases = [
            (
                "/v1/completions",
                {"prompt": "hi", "guided_decoding_backend": "xgrammar"},
                "guided_decoding_backend",
            ),
            ("/v1/completions", {"prompt": "hi", "stream_options": {"continuous_usage_stats": True}}, None),
            ("/v1/chat/completions", {**chat, "functions": []}, "functions"),
            ("/v1/chat/completions", {**chat, "tools": [{"type": "function"}]}, "tools.0.function"),
            ("/v1/chat/completions", {**chat, "audio": {"voice": "alloy"}}, "audio"),
            ("/v1/chat/completions", {**chat, "prediction": {"type": "content"}}, "prediction"),
            ("/v1/chat/completions", {**chat, "web_search_options": {}}, "web_search_options"),
            ("/v1/chat/completions", {**chat, "moderation": {"model": "m"}}, "moderation"),
            ("/v1/chat/completions", {**chat, "modalities": ["text", "audio"]}, "modalities.1"),
            ("/v1/chat/completions", {**chat, "reasoning_effort": "extreme"}, "reasoning_effort"),
            ("/v1/chat/completions", {**chat, "verbosity": 3}, "verbosity"),
            ("/v1/completions", {"prompt": "hi", "prompt_cache_key": "k"}, "prompt_cache_key"),
            ("/v1/chat/completions", {**chat, "temperature": 2.5}, "temperature"),
            ("/v1/chat/completions", {**chat, "stop": ["a"] * 17}, "stop"),
        ]
        for path, body, param in cases:
            r = client.post(path, json=body)
            assert r.status_code == 400, (body, r.text)
            if param is not None:
                assert r.json()["error"]["param"] == param, (body, r.json())
        assert client.post("/v1/completions", content=b'{"prompt": "a", "top_p": NaN}').status_code == 400
        accepted = {  # implemented, or advisory (schemas.py)
            **chat,
            "store": True,
            "reasoning_effort": "low",
            "verbosity": "low",
            "prompt_cache_key": "k",
            "prompt_cache_retention": "24h",
            "service_tier": "priority",
            "safety_identifier": "s1",
            "user": "u1",
            "metadata": {"k": "v"},
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "parallel_tool_calls": True,
        }
        assert client.post("/v1/chat/completions", json=accepted).status_code == 200


def test_admission_counts_sequences_against_running_plus_waiting():
    app, engine = _app()  # fake engine: max_num_seqs 4 + max_waiting 4 = 8 sequences at once

    async def go() -> None:
        async_engine = app.state.blazr.serving.engine
        engine.stalled = True
        params = SamplingParams(max_tokens=5)
        streams = [await async_engine.generate([EngineRequest(f"r{i}", [1], params)]) for i in range(8)]
        with pytest.raises(QueueFullError):
            await async_engine.generate([EngineRequest("r8", [1], params)])
        for st in streams:
            st.abort()
        with pytest.raises(BlazrError, match="at most 8"):
            await async_engine.generate([EngineRequest("big", [1], SamplingParams(max_tokens=2, n=9))])

    with TestClient(app) as client:
        _wait_ready(client)
        asyncio.run(go())


def test_openapi_documents_bodies_and_statuses():
    app, _ = _app()
    with TestClient(app) as client:
        doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "CompletionRequest" in schemas
    assert schemas["CompletionRequest"]["properties"]["temperature"]["anyOf"][0]["maximum"] == 2
    for path in ("/v1/completions", "/v1/chat/completions"):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("Request")
        assert set(op["responses"]) == {"200", "400", "401", "404", "413", "500", "503"}
        assert "text/event-stream" in op["responses"]["200"]["content"]
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(doc["paths"]["/health"]["get"]["responses"]) == {"200", "503"}


def test_tokenizing_runs_off_the_event_loop():
    """While one request's prompt is being tokenized (here: blocked until released), /health answers."""
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    class SlowTokenizer(FakeTokenizer):
        def encode(self, text: str) -> list[int]:
            entered.set()
            release.wait(5)
            returned.set()
            return super().encode(text)

    engine = FakeEngine()

    def loader(cfg: ServerConfig) -> LoadedModel:
        return LoadedModel(engine, SlowTokenizer(), ["fake"], "fake-model")  # type: ignore[arg-type]

    with TestClient(build_app(ServerConfig(), loader)) as client:
        _wait_ready(client)
        result: dict[str, int] = {}

        def slow() -> None:
            result["status"] = client.post(
                "/v1/completions", json={"prompt": "hi", "max_tokens": 2}
            ).status_code

        worker = threading.Thread(target=slow)
        worker.start()
        assert entered.wait(20)
        health = client.get("/health")  # would wait for encode to return if it held the event loop
        assert health.status_code == 200 and not returned.is_set()
        release.set()
        worker.join(20)
        assert result["status"] == 200


def test_cors_is_off_by_default_and_on_for_the_allowed_origins():
    """--allowed-origins: preflights answered for those origins (before the API key), their responses —
    errors included — carry the CORS headers; other origins get none. Without the flag: no CORS at all."""
    origin = {"Origin": "https://app.example.com"}
    preflight = {
        **origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    app, _ = _app()
    with TestClient(app) as client:
        _wait_ready(client)
        assert "access-control-allow-origin" not in client.get("/v1/models", headers=origin).headers
    app, _ = _app(api_key="secret", allowed_origins=("https://app.example.com",))
    with TestClient(app) as client:
        _wait_ready(client)
        r = client.options("/v1/chat/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "POST" in r.headers["access-control-allow-methods"]
        denied = client.get("/v1/models", headers=origin)  # no key: 401, still readable by the page
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == origin["Origin"]
        assert "X-Request-Id" in denied.headers["access-control-expose-headers"]
        other = client.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
