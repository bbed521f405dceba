"""Replicas on Ray Serve (`blazr serve --ray`, server/ray_serve.py).

- The command: `blazr serve --ray` starts local Ray, serves, and on SIGTERM exits 0 leaving no Ray process;
  the replica flags need --ray, and --ray without Ray installed is a one-line error.
- Pure parts: the routing key (a prompt's first characters; a chat's next turn keeps it), the affinity
  order with bounded loads, the `serve run` options.
- Served: one local Ray instance (`ray.init(num_cpus=2)`) with 2 CPU replicas of a tiny random Llama (one
  engine thread each), beside a plain `blazr serve` of the same checkpoint, both behind the same API key,
  driven by the official `openai` client: every request answered, by both replicas; greedy outputs equal to
  the single process for completions and chat, streamed and not; the same 401 and 400/404 JSON; a long
  shared prefix keeps hitting one replica (and its prefix cache); a replica killed (`ray.kill`) while
  requests stream → its requests end with an error (SSE error event + [DONE], or 503 JSON), never a hang,
  the other replica's finish, and Ray replaces it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from blazr.cli import main
from blazr.errors import BlazrError
from blazr.server.options import ServerConfig
from blazr.server.ray_router import affinity_choices, affinity_order, routing_key
from blazr.server.ray_serve import APP_NAME, Forwarder, _Start, build_ray_app, config_from_options
from tests.server_util import ServerProcess, descendants, parse_metrics
from tests.tiny import build

KEY = "sk-ray"
VOCAB = 100288  # cl100k_base ids fit: chat works
MODEL = "m"
ARGS = ["--served-model-name", MODEL, "--num-threads", "1", "--max-model-len", "512"]
REPLICA = "x-blazr-replica"


def _ids(seed: int, n: int) -> list[int]:
    """n ordinary cl100k ids, different for every seed."""
    rng = random.Random(seed)
    return [rng.randrange(300, 90000) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    build("LlamaForCausalLM", path, vocab_size=VOCAB)
    return path


# ------------------------------------------------------------------------------------------- the command


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_serve_ray_starts_serves_and_stops_leaving_no_ray_process(tiny):
    args = ["--ray", "--num-replicas", "1", "--model", str(tiny), *ARGS, "--shutdown-timeout", "2"]
    with ServerProcess(args, api_key=KEY) as server:
        assert server.proc is not None
        ray_pids = descendants(server.proc.pid)
        assert len(ray_pids) >= 3, ray_pids  # gcs, raylet, the replicas …
        out = server.client().completions.create(model=MODEL, prompt=_ids(0, 8), max_tokens=4, temperature=0)
        assert out.choices[0].finish_reason == "length" and out.model == MODEL
        assert server.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        server.signal(signal.SIGTERM)
        assert server.wait_exit(60) == 0, server.log_tail()
        log = server.log_tail(100_000)
    assert "blazr serve --ray: stopping" in log
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in ray_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in ray_pids if _alive(p)], "Ray processes outlived `blazr serve --ray`"


def test_replica_flags_need_ray(capsys):
    assert main(["serve", "--num-replicas", "2"]) == 1
    assert "--num-replicas, --min-replicas and --max-replicas need --ray" in capsys.readouterr().err


def test_ray_missing_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "blazr.server.ray_serve")
    assert main(["serve", "--ray"]) == 1
    assert capsys.readouterr().err == "error: --ray needs Ray Serve: pip install 'blazr[ray]'\n"


# ----------------------------------------------------------------------------------------- pure parts


def test_routing_key_is_the_prompts_first_characters():
    long = "a shared system prompt. " * 20
    body = json.dumps({"model": MODEL, "prompt": long + "question 1"}).encode()
    key = routing_key("/v1/completions", body, prefix_chars=256)
    assert key == f"model:{MODEL}\n" + long[:256]  # affinity is per (model, prefix)
    other = json.dumps({"model": MODEL, "prompt": long + "question 2", "max_tokens": 3}).encode()
    assert routing_key("/v1/completions", other, prefix_chars=256) == key
    another_model = json.dumps({"model": "other", "prompt": long + "question 1"}).encode()
    assert routing_key("/v1/completions", another_model, prefix_chars=256) not in (key, None)
    cached = {"model": MODEL, "prompt": "short", "prompt_cache_key": "k"}
    cached_other = json.dumps({**cached, "model": "other"}).encode()
    assert routing_key("/v1/completions", json.dumps(cached).encode(), 256) != routing_key(
        "/v1/completions", cached_other, 256
    )
    batch = {"model": MODEL, "prompt": [long]}
    assert routing_key("/v1/completions", json.dumps(batch).encode(), 256) == key  # a batch
    ids = list(range(1000, 1100))
    by_ids = routing_key("/v1/completions", json.dumps({"prompt": ids}).encode(), 256)
    assert by_ids is not None and by_ids.startswith("1000 1001 ")
    assert routing_key("/v1/completions", json.dumps({"prompt": [*ids[:60], 7]}).encode(), 256) == by_ids
    # no key: short prompts, other paths, bodies that are not a JSON object
    assert routing_key("/v1/completions", json.dumps({"prompt": "short"}).encode(), 256) is None
    assert routing_key("/tokenize", body, 256) is None
    assert routing_key("/v1/completions", b"{not json", 256) is None
    assert routing_key("/v1/completions", b"[1, 2]", 256) is None


def test_every_chat_api_keys_the_same_conversation_alike():
    """Responses (instructions + input), Anthropic (system + messages) and Ollama's /api/chat route the
    conversation that chat completions would, to the same replica; /api/generate by its prompt."""
    system = "You answer in French. " * 15
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "Bonjour ?"}]
    bodies = {
        "/v1/chat/completions": {"messages": chat},
        "/v1/responses": {"instructions": system, "input": "Bonjour ?"},
        "/v1/messages": {"system": system, "messages": chat[1:], "max_tokens": 5},
        "/api/chat": {"messages": chat},
    }
    keys = {routing_key(path, json.dumps(b).encode(), 256) for path, b in bodies.items()}
    assert len(keys) == 1 and None not in keys
    assert routing_key("/api/generate", json.dumps({"prompt": system}).encode(), 256) == system[:256]


def test_a_chats_next_turn_keeps_its_key_and_the_system_prompt_decides():
    system = {"role": "system", "content": "You answer in French. " * 15}
    turn1 = [system, {"role": "user", "content": "Bonjour ?"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Et ?"}]

    def key(messages: list[dict[str, Any]], **extra: Any) -> str | None:
        body = json.dumps({"model": MODEL, "messages": messages, **extra}).encode()
        return routing_key("/v1/chat/completions", body, 256)

    assert key(turn1) is not None and key(turn1) == key(turn2)
    other_system = [{"role": "system", "content": "You answer in German. " * 15}, *turn1[1:]]
    assert key(other_system) != key(turn1)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert key(turn1, tools=tools) != key(turn1)  # the tools are rendered first
    parts = [{**system, "content": [{"type": "text", "text": system["content"]}]}, turn1[1]]
    assert key(parts) == key(turn1)
    assert key([{"role": "user", "content": "hi"}]) is None


def test_affinity_is_stable_bounded_and_moves_little():
    replicas = ["r1", "r2", "r3", "r4"]
    keys = [f"prefix {i}" for i in range(400)]
    first = {k: affinity_order(k, replicas)[0] for k in keys}
    assert {k: affinity_order(k, list(reversed(replicas)))[0] for k in keys} == first  # order-free
    share = {r: list(first.values()).count(r) / len(keys) for r in replicas}
    assert all(0.15 < s < 0.35 for s in share.values()), share
    # a replica leaves: only its keys move
    left = {k: affinity_order(k, ["r1", "r2", "r4"])[0] for k in keys}
    assert all(left[k] == first[k] for k in keys if first[k] != "r3")
    # bounded loads: the affinity replica is skipped once it is more than the threshold above the least
    key = keys[0]
    best, second = affinity_order(key, replicas)[:2]
    idle = dict.fromkeys(replicas, 0)
    assert affinity_choices(key, idle, imbalance_threshold=2)[0] == best
    assert affinity_choices(key, {**idle, best: 2}, imbalance_threshold=2)[0] == best
    busy = affinity_choices(key, {**idle, best: 3}, imbalance_threshold=2)
    assert best not in busy and busy[0] == second
    assert affinity_choices(key, dict.fromkeys(replicas), 2) == affinity_order(key, replicas)  # unknown


def test_serve_run_options():
    config, extra = config_from_options(
        {
            "model": "/m",
            "num_replicas": "3",
            "cpu": "true",
            "served_model_names": "a,b",
            "max_model_len": "none",
            "cache_memory": "1.5",
            "prefix_chars": "128",
        }
    )
    assert (config.load.model, config.num_replicas, config.load.cpu, config.served_model_names) == (
        "/m",
        3,
        True,
        ("a", "b"),
    )
    assert (
        config.engine.max_model_len is None
        and config.engine.cache_memory_gib == 1.5
        and extra == {"prefix_chars": 128}
    )
    with pytest.raises(BlazrError, match="unknown blazr option"):
        config_from_options({"modle": "x"})
    app = build_ray_app(ServerConfig.of(num_replicas=2, cpu=True, num_threads=1))
    assert app is not None


class _FakeStream:
    """What a streaming handle call returns, scripted: items, then maybe an exception."""

    def __init__(self, items: list[Any], error: BaseException | None = None) -> None:
        self.items, self.error = list(items), error

    def __aiter__(self) -> _FakeStream:
        return self

    async def __anext__(self) -> Any:
        if self.items:
            return self.items.pop(0)
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration


def _relay(stream: _FakeStream) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(Forwarder._relay(stream, send))
    assert sent[0]["type"] == "http.response.start" and not sent[-1].get("more_body", False)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], dict(sent[0]["headers"]), body


SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
JSON = [(b"content-type", b"application/json")]


def test_what_the_ingress_answers_when_the_replica_side_fails():
    # before the answer starts: OpenAI error JSON, 503 + Retry-After for a dead replica or a full queue
    for error, code in ((ActorDiedError(), "replica_unavailable"), (BackPressureError(5, 5), "queue_full")):
        status, headers, body = _relay(_FakeStream([], error))
        assert status == 503 and headers[b"retry-after"] == b"1", (status, headers)
        assert json.loads(body)["error"]["code"] == code
    status, _, body = _relay(_FakeStream([], RuntimeError("a bug")))
    assert status == 500 and "a bug" not in body.decode()
    # a whole answer cut short is not sent half: the client gets the error instead
    status, _, body = _relay(_FakeStream([_Start(200, JSON), b'{"id": '], ActorDiedError()))
    assert status == 503 and json.loads(body)["error"]["code"] == "replica_unavailable"
    # a stream cut short ends with an SSE error event and [DONE]
    status, _, body = _relay(_FakeStream([_Start(200, SSE), b'data: {"a": 1}\n\n'], ActorDiedError()))
    events = body.decode().split("\n\n")
    assert status == 200 and events[0] == 'data: {"a": 1}' and events[-2:] == ["data: [DONE]", ""], events
    assert json.loads(events[1].removeprefix("data: "))["error"]["code"] == "replica_unavailable"
    # and what the replica answered passes through untouched
    assert _relay(_FakeStream([_Start(404, JSON), b"{}"])) == (404, dict(JSON), b"{}")
    assert _relay(_FakeStream([_Start(200, SSE), b"data: 1\n\n", b"data: [DONE]\n\n"]))[2] == (
        b"data: 1\n\ndata: [DONE]\n\n"
    )


# ------------------------------------------------------------------------------------------------ served


@pytest.fixture(scope="module")
def single(tiny):
    with ServerProcess(["--model", str(tiny), *ARGS], api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def replicas(tiny):
    """2 replicas on a local Ray instance. A ServerProcess that is never started gives the free port and
    the clients; Ray's proxy serves on that port."""
    endpoint = ServerProcess(api_key=KEY)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": endpoint.port})
        config = ServerConfig.of(
            model=str(tiny),
            cpu=True,
            num_replicas=2,
            num_threads=1,
            max_model_len=512,
            served_model_names=(MODEL,),
            api_key=KEY,
        )
        serve.run(build_ray_app(config), name=APP_NAME, route_prefix="/")
        # serve.run returns once both replicas run, but the proxy's router learns of them later: once (a
        # loaded CI host) it knew one while 16 requests went out, and that one answered all. Unkeyed GETs
        # (power of two choices) until both have answered, so the tests route over both.
        seen: set[str] = set()
        deadline = time.monotonic() + 120
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"only replica(s) {seen} answered in 120 s"
            seen.add(httpx.get(f"{endpoint.url}/metrics", timeout=30).headers[REPLICA])
        yield endpoint
    finally:
        endpoint.stop()
        serve.shutdown()
        ray.shutdown()


def _token_ids(choice: Any) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens]


async def _completions(server: ServerProcess, prompts: list[list[int]], max_tokens: list[int]) -> list[tuple]:
    """Greedy completions sent all at once: (token ids, finish reason, replica) each."""
    async with server.async_client() as client:

        async def one(prompt: list[int], n: int) -> tuple:
            raw = await client.completions.with_raw_response.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=n,
                temperature=0,
                logprobs=0,
                extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
            )
            choice = raw.parse().choices[0]
            return _token_ids(choice), choice.finish_reason, raw.headers.get(REPLICA)

        return list(await asyncio.gather(*(one(p, n) for p, n in zip(prompts, max_tokens, strict=True))))


def test_every_request_is_answered_by_both_replicas_as_one_process_answers(replicas, single):
    prompts = [_ids(i, 5 + 23 * i) for i in range(16)]  # 5 … 350 tokens: some keyed, some not
    max_tokens = [4 + (7 * i) % 17 for i in range(16)]
    got = asyncio.run(_completions(replicas, prompts, max_tokens))
    want = asyncio.run(_completions(single, prompts, max_tokens))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g[:2] == w[:2], f"request {i}: {g[:2]} != {w[:2]}"
        assert len(g[0]) == max_tokens[i]
    assert len({g[2] for g in got}) == 2, [g[2] for g in got]
    assert all(w[2] is None for w in want)


def test_streamed_completions_and_chat_equal_one_process(replicas, single):
    def run(server: ServerProcess) -> list[Any]:
        client = server.client()
        prompt = _ids(100, 40)
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        pieces = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].text for c in pieces if c.choices)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
        chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=16,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        chat_streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
        return [
            whole.choices[0].text,
            whole.choices[0].finish_reason,
            streamed,
            chat.choices[0].message.content,
            chat.choices[0].finish_reason,
            chat_streamed,
            (usage.prompt_tokens, usage.completion_tokens),
        ]

    got, want = run(replicas), run(single)
    assert got == want
    assert got[0] == got[2] and got[3] == got[5] and got[0]


def test_api_key_refusals_are_the_same_and_probes_stay_open(replicas, single):
    def refusals(server: ServerProcess) -> list[tuple]:
        out = []
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/tokenize")):
                r = httpx.request(method, f"{server.url}{path}", headers=headers, json={"prompt": "x"})
                out.append((r.status_code, r.json(), r.headers.get("www-authenticate")))
        return out

    got = refusals(replicas)
    assert got == refusals(single)
    assert all(status == 401 for status, _, _ in got)
    assert httpx.get(f"{replicas.url}/health").json() == {"status": "ok"}  # no key needed
    cards = [replicas.get("/v1/models").json()["data"], single.get("/v1/models").json()["data"]]
    for card in (*cards[0], *cards[1]):
        card.pop("created")  # each process's start time
    assert cards[0] == cards[1]


BAD_REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "bogus": 1}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}),
    ("POST", "/v1/completions", {"model": "no-such-model", "prompt": "x"}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": _ids(1, 600), "max_tokens": 4}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "stream": True, "n": 0}),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": []}),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}),
    ("POST", "/v1/chat/completions", b'{"model": "m", "messages": ['),
    ("POST", "/v1/nope", {}),
    ("GET", "/v1/models/no-such-model", None),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD_REQUESTS)
def test_bad_requests_get_the_same_error_json(replicas, single, method, path, body):
    def ask(server: ServerProcess) -> tuple[int, Any]:
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        headers = {**server.headers(), "Content-Type": "application/json"}
        r = httpx.request(method, f"{server.url}{path}", content=content, headers=headers, timeout=60)
        return r.status_code, r.json()

    got = ask(replicas)
    assert got == ask(single)
    assert got[0] in (400, 404) and set(got[1]["error"]) == {"message", "type", "param", "code"}


def _complete(server: ServerProcess, prompt: list[int] | str, max_tokens: int = 2) -> tuple[str, int]:
    """(replica, cached prompt tokens) of one greedy completion."""
    raw = server.client().completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    usage = raw.parse().usage
    return raw.headers[REPLICA], usage.prompt_tokens_details.cached_tokens


def test_a_shared_prefix_keeps_hitting_the_replica_that_caches_it(replicas):
    prefix = _ids(200, 100)  # 100 ids ≈ 600 characters: keyed
    hits = [_complete(replicas, prefix + _ids(300 + i, 20)) for i in range(8)]
    assert len({replica for replica, _ in hits}) == 1, hits
    assert hits[0][1] == 0 and all(cached == 96 for _, cached in hits[1:]), hits  # 6 whole blocks of 16
    # the next turn of a chat with a long system prompt goes where the first turn went
    client = replicas.client()
    system = {"role": "system", "content": "You are a terse assistant for a shipping company. " * 8}
    turn1 = [system, {"role": "user", "content": "Where is parcel 12?"}]
    raw1 = client.chat.completions.with_raw_response.create(model=MODEL, messages=turn1, max_tokens=8)
    answer = raw1.parse().choices[0].message.content
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And 13?"}]
    raw2 = client.chat.completions.with_raw_response.create(model=MODEL, messages=turn2, max_tokens=8)
    assert raw2.headers[REPLICA] == raw1.headers[REPLICA]
    assert raw2.parse().usage.prompt_tokens_details.cached_tokens > 0
    # different prefixes spread over both replicas
    spread = {_complete(replicas, _ids(400 + i, 60))[0] for i in range(16)}
    assert len(spread) == 2


def _replica_metrics(server: ServerProcess, replicas: set[str]) -> dict[str, dict[str, float]]:
    """/metrics of every replica in `replicas` (each scrape reaches one replica; ask until all answered)."""
    seen: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + 30
    while set(seen) != replicas:
        assert time.monotonic() < deadline, f"/metrics never reached {replicas - set(seen)}"
        r = httpx.get(f"{server.url}/metrics", timeout=30)
        seen[r.headers[REPLICA]] = parse_metrics(r.text)
    return seen


def test_a_client_that_goes_away_frees_its_slot_on_the_replica(replicas):
    everyone = {_complete(replicas, _ids(600 + i, 60))[0] for i in range(16)}
    aborted = 'blazr:request_success_total{finished_reason="abort"}'
    before = sum(m[aborted] for m in _replica_metrics(replicas, everyone).values())
    body = {"model": MODEL, "prompt": _ids(7, 10), "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{replicas.url}/v1/completions", json=body, headers=replicas.headers()) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 4:
                break  # hang up mid-stream
    body = {**body, "stream": False}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{replicas.url}/v1/completions", json=body, headers=replicas.headers(), timeout=0.5)
    deadline = time.monotonic() + 30
    while True:
        metrics = _replica_metrics(replicas, everyone).values()
        if sum(m[aborted] for m in metrics) == before + 2 and all(
            m["blazr:num_requests_running"] == 0 for m in metrics
        ):
            break
        assert time.monotonic() < deadline, "the abandoned requests were not aborted"
        time.sleep(0.2)


async def _stream(http: httpx.AsyncClient, prompt: list[int], started: asyncio.Event, out: dict) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        out["status"], out["replica"], events = r.status_code, r.headers.get(REPLICA), []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()
        out["events"] = events


async def _whole(http: httpx.AsyncClient, prompt: list[int], out: dict) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    r = await http.post("/v1/completions", json=body)
    out["status"], out["replica"], out["body"] = r.status_code, r.headers.get(REPLICA), r.json()


def _replica_states() -> dict[str, int]:
    return serve.status().applications[APP_NAME].deployments["BlazrReplica"].replica_states


def test_a_killed_replica_fails_its_requests_cleanly_and_ray_replaces_it(replicas):
    """(Last: it changes the replica set.) Streams on the killed replica end with an error event and
    [DONE], whole answers it owed are 503 JSON; the other replica's requests finish; Ray starts a new
    replica and it serves."""

    async def load() -> tuple[str, list[dict], list[dict]]:
        headers = replicas.headers()
        async with httpx.AsyncClient(base_url=replicas.url, headers=headers, timeout=120) as http:
            streams = [{} for _ in range(6)]
            wholes = [{} for _ in range(2)]
            started = [asyncio.Event() for _ in streams]
            tasks = [
                asyncio.create_task(_stream(http, [7, 8, i], e, s))
                for i, (e, s) in enumerate(zip(started, streams, strict=True))
            ]
            tasks += [asyncio.create_task(_whole(http, [9, 9, i], w)) for i, w in enumerate(wholes)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            on = {s["replica"] for s in streams}
            assert len(on) == 2, f"the streams did not spread over both replicas: {on}"
            victim = streams[0]["replica"]
            [name] = [
                a["name"]
                for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].endswith(f"#{victim}")
            ]
            ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)  # nothing hangs
            return victim, streams, wholes

    victim, streams, wholes = asyncio.run(load())
    for s in streams:
        assert s["status"] == 200 and s["events"][-1] == "[DONE]", s
        last = json.loads(s["events"][-2])
        if s["replica"] == victim:
            assert last["error"]["code"] == "replica_unavailable", last
        else:
            assert last["usage"]["completion_tokens"] == 300, last
    assert any(s["replica"] != victim for s in streams)
    for w in wholes:
        if w["status"] == 200:
            assert w["body"]["usage"]["completion_tokens"] == 300
        else:
            assert w["status"] == 503 and w["body"]["error"]["code"] == "replica_unavailable", w
    deadline = time.monotonic() + 120
    while _replica_states() != {"RUNNING": 2}:
        assert time.monotonic() < deadline, f"no replacement replica: {_replica_states()}"
        time.sleep(0.5)
    # the router hears of the new replica a moment later; until then the survivor takes everything
    old, served = {s["replica"] for s in streams}, set()
    for i in range(1000):
        served.add(_complete(replicas, _ids(500 + i, 60))[0])
        if served - old:
            break
        assert time.monotonic() < deadline, f"no request reached the new replica: {served}"
    assert victim not in served, served
