"""The server app in-process with a scripted fake engine: loading states, load failure, an engine crash,
the API-key guard, abort on early close and error formatting — the paths a real model cannot trigger on
demand. (End-to-end behaviour with real models is in test_server.py.)"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from blazr.engine.async_engine import AsyncEngine, EngineRequest
from blazr.engine.engine import QueueFullError, SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.errors import BlazrError
from blazr.server.app import LoadedModel, build_app
from blazr.server.errors import validation_message
from blazr.server.options import ServerConfig
from blazr.server.schemas import CompletionRequest

CRASH = 666  # a prompt holding this token id makes the fake engine's step raise


@dataclass
class _Cfg:
    max_model_len: int = 64
    max_waiting: int = 4
    max_num_seqs: int = 4


class FakeEngine:
    """LLMEngine's surface, scripted: every step emits one 'x' per request until max_tokens."""

    vocab_size = 1000

    def __init__(self) -> None:
        self.cfg = _Cfg()
        self.active: dict[str, tuple[list[int], SamplingParams, int]] = {}
        self.aborted: list[str] = []

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) + params.max_tokens > self.cfg.max_model_len:
            raise BlazrError(f"too long: {len(prompt_ids)} + {params.max_tokens} > {self.cfg.max_model_len}")

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(self.active) >= self.cfg.max_waiting:
            raise QueueFullError("full")
        self.active[rid] = (prompt_ids, params, 0)

    def abort_request(self, rid: str) -> list[SeqOutput]:
        if self.active.pop(rid, None) is None:
            return []
        self.aborted.append(rid)
        return [SeqOutput(rid, 0, [], "", [], True, "abort", 1, 0)]

    def has_unfinished(self) -> bool:
        return bool(self.active)

    def step(self) -> list[SeqOutput]:
        outs = []
        for rid, (ids, params, done) in list(self.active.items()):
            if CRASH in ids:
                raise RuntimeError("boom")
            done += 1
            finished = done >= params.max_tokens
            outs.append(
                SeqOutput(rid, 0, [120], "x", [], finished, "length" if finished else None, len(ids), done)
            )
            if finished:
                del self.active[rid]
            else:
                self.active[rid] = (ids, params, done)
        threading.Event().wait(0.002)
        return outs

    num_running = property(lambda self: len(self.active))
    num_waiting = property(lambda self: 0)
    cache_usage = property(lambda self: 0.0)


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

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


def _app(gate: threading.Event | None = None, fail: Exception | None = None, api_key: str | None = None):
    engine = FakeEngine()

    def loader(cfg: ServerConfig) -> LoadedModel:
        if gate is not None:
            gate.wait(30)
        if fail is not None:
            raise fail
        return LoadedModel(engine, FakeTokenizer(), ["fake"], "/nowhere")  # type: ignore[arg-type]

    return build_app(ServerConfig(api_key=api_key), loader), engine


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
    app, _ = _app(fail=BlazrError("no such checkpoint"))
    failures: list[str] = []
    app.state.blazr.on_load_failed.append(failures.append)
    with TestClient(app) as client:
        for _ in range(500):
            if app.state.blazr.status == "failed":
                break
            threading.Event().wait(0.01)
        r = client.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "error", "error": "no such checkpoint"}
        r = client.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 500 and "no such checkpoint" in r.json()["error"]["message"]
    assert failures == ["no such checkpoint"]


def test_engine_crash_is_500_json_never_a_hang():
    app, _ = _app()
    with TestClient(app) as client:
        _wait_ready(client)
        stream = client.post("/v1/completions", json={"prompt": [1, CRASH], "max_tokens": 5, "stream": True})
        events = [e for e in stream.text.split("\n\n") if e]
        assert '"engine_error"' in events[-2] and events[-1] == "data: [DONE]"
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "traceback" not in r.text.lower()
        assert client.get("/health").status_code == 503


def test_api_key_guards_v1_only():
    app, _ = _app(api_key="secret")
    with TestClient(app) as client:
        _wait_ready(client)
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Basic secret"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert client.get("/v1/models", headers={"authorization": "bearer secret"}).status_code == 200


def test_closing_a_stream_early_aborts_its_requests():
    engine = FakeEngine()

    async def go() -> None:
        async_engine = AsyncEngine(engine)  # type: ignore[arg-type]
        async_engine.start()
        try:
            params = SamplingParams(max_tokens=50)
            stream = await async_engine.generate(
                [EngineRequest("a", [1], params), EngineRequest("b", [2], params)]
            )
            it = stream.__aiter__()
            await it.__anext__()
            await it.aclose()
            for _ in range(500):
                if sorted(engine.aborted) == ["a", "b"]:
                    break
                await asyncio.sleep(0.01)
            assert sorted(engine.aborted) == ["a", "b"]
            with pytest.raises(BlazrError, match="too long"):
                await async_engine.generate([EngineRequest("c", [1] * 60, params)])
        finally:
            async_engine.shutdown()

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
    assert (cfg.host, cfg.port, cfg.api_key, cfg.max_num_seqs, cfg.max_waiting) == (
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
    assert (cfg.api_key, cfg.served_model_names, cfg.max_waiting, cfg.port) == ("flag", ("a", "b"), 2, 9)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-num-seqs", "0"])
