"""Several models behind one `blazr serve` (server/model_pool.py): real server subprocesses over tiny random
checkpoints — two Llama directories and a GGUF file in a `--models-dir`, beside a broken checkpoint.

Each model answers by name exactly as it does alone (`blazr.LLM`; greedy, token for token), alone and
in one batch of concurrent calls to all of them; models load on first use (`unloaded` before, `loaded`
after, /health 200 from the start); `--max-loaded-models 1` unloads the least recently used and reloads it
on demand with the same output; `--sleep-idle-seconds` puts the embedded SmolLM2 to sleep (RSS drops) and
the next request reloads it and answers the same; Ollama's keep_alive; an unknown model is a 404, a broken
one a 503 with a one-line reason while the others serve. Plus the flags and the names (no server).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import time
from pathlib import Path

import pytest

from blazr import LLM
from blazr.cli import build_parser
from blazr.engine.sampling import SamplingParams
from blazr.errors import BlazrError
from blazr.server.model_catalog import catalog, model_name
from blazr.server.ollama_api import keep_alive_seconds
from blazr.server.options import ServerConfig
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.server_util import ServerProcess, parse_metrics
from tests.tiny import build

PROMPTS = [[5, 17, 300, 42], [900, 3, 3, 77, 12, 8, 640]]
MAX_TOKENS = 8
NAMES = ("alpha", "beta", "gamma")
COMMON = ["--max-model-len", "256"]


def _greedy(server: ServerProcess, model: str, prompt: list[int]) -> list[str]:
    r = server.client().completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=0,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    assert r.model == model
    tokens = r.choices[0].logprobs.tokens
    assert tokens is not None and len(tokens) == MAX_TOKENS
    return tokens


def _states(server: ServerProcess) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in server.get("/v1/models").json()["data"]}


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build("LlamaForCausalLM", root / "alpha", seed=0)
    build("LlamaForCausalLM", root / "beta", seed=1)
    gamma = build("LlamaForCausalLM", tmp_path_factory.mktemp("gamma-hf"), seed=2)
    vocab = [f"t{i}" for i in range(gamma.config.vocab_size)]
    merges = {"tokenizer.ggml.merges": ["t 1"]}
    write_tiny_llama_gguf(root / "gamma.gguf", gamma.state_dict(), gamma.config, vocab=vocab, metadata=merges)
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{}")  # a checkpoint directory with no weights
    (root / ".hidden").mkdir()  # skipped, as is a file that is no checkpoint
    (root / "notes.txt").write_text("not a model")
    return root


def _path(models_dir: Path, name: str) -> Path:
    return models_dir / f"{name}.gguf" if name == "gamma" else models_dir / name


@pytest.fixture(scope="module")
def alone(models_dir) -> dict[str, list[list[str]]]:
    """Each model's greedy tokens alone: `blazr.LLM` of it in this process, the engine a one-model server
    runs (as `return_tokens_as_token_ids` names them)."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    for name in NAMES:
        llm = LLM(_path(models_dir, name), cpu=True, max_model_len=256, cache_memory_gib=0.25)
        out[name] = [[f"token_id:{t}" for t in r.outputs[0].token_ids] for r in llm.generate(PROMPTS, params)]
        llm.close()
    return out


@pytest.fixture(scope="module")
def pool(models_dir):
    with ServerProcess(["--models-dir", str(models_dir), *COMMON]) as server:
        yield server


# ---------------------------------------------------------------------------------------- one pool


def test_models_load_on_first_use_and_answer_as_alone(pool, alone):
    assert pool.health_seen == [200]  # up at once: nothing loads at startup
    assert _states(pool) == dict.fromkeys(["alpha", "beta", "broken", "gamma"], "unloaded")
    assert "loaded in" not in pool.log_text()
    for name in NAMES:
        assert [_greedy(pool, name, p) for p in PROMPTS] == alone[name], name
        assert _states(pool)[name] == "loaded"
    card = pool.get("/v1/models/gamma").json()
    assert card["status"]["value"] == "loaded" and card["max_model_len"] == 256
    assert card["status"]["load_seconds"] >= 0


def test_concurrent_requests_to_three_models(pool, alone):
    async def run() -> list[list[str]]:
        async with pool.async_client() as client:

            async def one(name: str, prompt: list[int]) -> list[str]:
                r = await client.completions.create(
                    model=name,
                    prompt=prompt,
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    logprobs=0,
                    extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
                )
                return r.choices[0].logprobs.tokens

            calls = [(n, p) for p in PROMPTS for n in NAMES]
            return list(await asyncio.gather(*(one(n, p) for n, p in calls)))

    results = asyncio.run(run())
    calls = [(n, i) for i in range(len(PROMPTS)) for n in NAMES]
    for (name, i), tokens in zip(calls, results, strict=True):
        assert tokens == alone[name][i], (name, i)


def test_ollama_and_tokenize_pick_the_model_by_name(pool):
    # (the chat APIs: on the SmolLM2 pool below; these tiny models' 1k vocabularies hold no chat template)
    body = {"model": "alpha:latest", "prompt": "a b. c", "raw": True, "stream": False}
    r = pool.post("/api/generate", json={**body, "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["model"] == "alpha:latest" and r.json()["eval_count"] == 3
    r = pool.post("/detokenize", json={"model": "gamma", "tokens": [1023, 7]})
    assert r.status_code == 200 and r.json()["prompt"] == "t1023t7"  # gamma's own vocabulary
    r = pool.post("/detokenize", json={"model": "alpha", "tokens": [64, 293]})
    assert r.status_code == 200 and r.json()["prompt"] == "a b"
    tags = {m["name"] for m in pool.get("/api/tags").json()["models"]}
    assert tags == {"alpha", "beta", "broken", "gamma"}
    loaded = {m["name"]: m for m in pool.get("/api/ps").json()["models"]}
    assert {"alpha", "beta", "gamma"} <= set(loaded) and "broken" not in loaded
    assert loaded["gamma"]["details"]["format"] == "gguf" and loaded["gamma"]["context_length"] == 256


def test_an_unknown_model_is_a_404_in_each_dialect(pool):
    r = pool.post("/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert pool.get("/v1/models/nope").status_code == 404
    r = pool.post("/api/generate", json={"model": "nope", "prompt": "x", "stream": False})
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_a_broken_checkpoint_fails_alone(pool, alone, models_dir):
    r = pool.post("/v1/completions", json={"model": "broken", "prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["code"] == "model_load_failed" and "broken" in error["message"]
    assert "\n" not in error["message"] and str(models_dir) not in error["message"]  # no server path
    status = pool.get("/v1/models/broken").json()["status"]
    assert status["value"] == "failed" and status["error"] in error["message"]
    # asked again, it is refused at once (no second load), and the others keep serving
    again = pool.post("/v1/completions", json={"model": "broken", "prompt": [1, 2], "max_tokens": 2})
    assert again.status_code == 503 and pool.log_text().count("model broken failed to load") == 1
    assert _greedy(pool, "alpha", PROMPTS[0]) == alone["alpha"][0]
    assert pool.get("/health").status_code == 200


def test_metrics_show_each_models_state(pool):
    _greedy(pool, "alpha", PROMPTS[0])
    m = parse_metrics(pool.get("/metrics").text)
    assert m['blazr:model_state{model="alpha",state="loaded"}'] == 1
    assert m['blazr:model_state{model="alpha",state="unloaded"}'] == 0
    states = {k for k, v in m.items() if k.startswith("blazr:model_state") and v == 1}
    assert len(states) == 4  # one state per model


# -------------------------------------------------------------------------------------- LRU, sleep


def test_max_loaded_models_unloads_the_least_recently_used(models_dir, alone):
    args = ["--model", str(models_dir / "alpha"), "--model", str(models_dir / "beta"), *COMMON]
    with ServerProcess([*args, "--max-loaded-models", "1"]) as server:
        # three requests at once for a model not loaded yet: one load, each answer as alone
        async def three() -> list[list[str]]:
            return await asyncio.gather(
                *(asyncio.to_thread(_greedy, server, "alpha", PROMPTS[0]) for _ in range(3))
            )

        assert asyncio.run(three()) == [alone["alpha"][0]] * 3
        assert server.log_text().count("model alpha loaded in") == 1
        assert _states(server) == {"alpha": "loaded", "beta": "unloaded"}
        assert _greedy(server, "beta", PROMPTS[1]) == alone["beta"][1]
        assert _states(server) == {"alpha": "unloaded", "beta": "loaded"}
        assert _greedy(server, "alpha", PROMPTS[1]) == alone["alpha"][1]  # reloaded on demand
        assert _states(server) == {"alpha": "loaded", "beta": "unloaded"}
        log = server.log_text()
        assert "model alpha unloaded (to make room)" in log and "model alpha reloaded in" in log

        # a model in use is never unloaded: beta waits for alpha's long stream to end, then both are whole
        async def both() -> tuple[list[str], list[str]]:
            async with server.async_client() as client:
                stream = await client.completions.create(
                    model="alpha", prompt=PROMPTS[0], max_tokens=120, temperature=0, stream=True,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                first = await anext(aiter(stream))  # alpha is generating now
                beta = asyncio.create_task(asyncio.to_thread(_greedy, server, "beta", PROMPTS[1]))
                reasons = [first.choices[0].finish_reason]
                reasons += [c.choices[0].finish_reason async for c in stream]
                return reasons, await beta

        reasons, beta_tokens = asyncio.run(both())
        assert reasons[-1] == "length" and beta_tokens == alone["beta"][1]  # (an unload mid-stream: an error)


def test_an_idle_model_sleeps_frees_its_memory_and_reloads(tmp_path):
    name = "SmolLM2-135M-Instruct"  # the embedded model: its weights are big enough to see in RSS
    prompt = [504, 3575, 282, 4649, 314]
    with ServerProcess(["--sleep-idle-seconds", "1", "--max-model-len", "512"]) as server:
        assert _states(server) == {name: "unloaded"}
        first = _greedy(server, name, prompt)
        loaded_rss = server.rss_bytes()
        _wait_for(lambda: "sleeping (idle for 1s)" in server.log_text())
        assert _states(server) == {name: "sleeping"}
        slept_rss = server.rss_bytes()
        assert slept_rss < loaded_rss - (50 << 20), (loaded_rss, slept_rss)  # weights and pools gone
        assert _greedy(server, name, prompt) == first  # reloaded on the next request
        assert "reloaded in" in server.log_text() and _states(server)[name] == "loaded"
        assert server.get("/api/ps").json()["models"][0]["name"] == name
        chat = [{"role": "user", "content": "Hi"}]
        r = server.post("/v1/messages", json={"model": name, "max_tokens": 3, "messages": chat})
        assert r.status_code == 200 and r.json()["model"] == name
        r = server.post("/v1/chat/completions", json={"model": name, "max_tokens": 3, "messages": chat})
        assert r.status_code == 200 and r.json()["model"] == name
        r = server.post("/v1/responses", json={"model": name, "max_output_tokens": 3, "input": "Hi"})
        assert r.status_code == 200 and r.json()["model"] == name
        assert server.get(f"/v1/responses/{r.json()['id']}").status_code == 200  # the pool's shared store

        # Ollama's keep_alive: 1h keeps it loaded past the server's 1 s; 0 unloads it once done
        body = {"model": name, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
        _wait_for(lambda: _states(server)[name] == "sleeping")
        load = server.post("/api/generate", json={"model": name})  # Ollama's "load the model" request
        assert load.json()["done_reason"] == "load" and load.json()["load_duration"] > 0
        assert _states(server)[name] == "loaded"
        assert server.post("/api/generate", json={**body, "keep_alive": "1h"}).status_code == 200
        time.sleep(2.5)
        assert _states(server)[name] == "loaded"
        assert server.post("/api/generate", json={**body, "keep_alive": 0}).status_code == 200
        _wait_for(lambda: _states(server)[name] == "sleeping")
        assert server.get("/api/ps").json()["models"] == []
        bad = server.post("/api/generate", json={**body, "keep_alive": "soon"})
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]


# ------------------------------------------------------------------------------ flags and names


def _config(*argv: str) -> ServerConfig:
    return ServerConfig.from_args(build_parser().parse_args(["serve", *argv]))


def test_a_server_stopped_while_a_model_loads_answers_503_and_exits_0(tmp_path):
    """SIGTERM while a request waits for a model's load: the drain's window passes, the request gets a
    503 `shutting_down` (not a traceback when uvicorn cancels it), and the server exits 0 past the load
    still running — which it had waited for: the loop's executor, where loads ran, is joined as the loop
    ends. The weights file is a FIFO nobody writes: the load blocks where it opens it."""
    model = tmp_path / "models" / "blocked"
    build("LlamaForCausalLM", model)
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")
    server = ServerProcess(["--models-dir", str(model.parent), *COMMON, "--shutdown-timeout", "1"]).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            body = {"model": "blocked", "prompt": [5, 6], "max_tokens": 2}
            answer = ex.submit(server.post, "/v1/completions", json=body)
            _wait_for(lambda: _states(server) == {"blocked": "loading"})
            server.signal(signal.SIGTERM)
            r = answer.result()
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        assert server.wait_exit(60) == 0
        log = server.log_tail()
        assert "stopped while model blocked was loading" in log and "Traceback" not in log, log
    finally:
        server.stop()


def test_model_repeated_and_models_dir_flags():
    cfg = _config("--model", "a", "--model", "b", "-m", "c", "--max-loaded-models", "2")
    assert cfg.load.model == "a" and cfg.models == ("b", "c") and cfg.is_multi_model
    assert cfg.max_loaded_models == 2 and cfg.sleep_idle_seconds is None
    assert _config("--model", "a", "--model", "b", "--models", "c", "d").models == ("b", "c", "d")
    one = _config("--model", "a")
    assert one.load.model == "a" and one.models == () and not one.is_multi_model  # as before
    assert _config("--sleep-idle-seconds", "30").is_multi_model
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-loaded-models", "0"])


def test_model_names(tmp_path):
    (tmp_path / "m.Q4_K_M.gguf").write_bytes(b"")
    (tmp_path / "dir-model").mkdir()
    (tmp_path / "dir-model" / "config.json").write_text("{}")
    assert model_name(str(tmp_path / "m.Q4_K_M.gguf")) == "m.Q4_K_M"
    assert model_name(str(tmp_path / "dir-model") + "/") == "dir-model"
    assert model_name("org/some-model") == "org/some-model"  # a repo id as written
    assert model_name("/no/such/dir/x.gguf") == "x"  # a missing file: loading it will say so
    names = catalog(_config("--model", "org/x", "--models-dir", str(tmp_path)))
    assert list(names) == ["org/x", "dir-model", "m.Q4_K_M"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.safetensors").write_bytes(b"")
    with pytest.raises(BlazrError, match="two models are named 'dir-model'"):
        catalog(_config("--model", str(tmp_path / "dir-model"), "--models-dir", str(tmp_path)))
    with pytest.raises(BlazrError, match="--served-model-name"):
        catalog(_config("--model", "a/b", "--model", "c/d", "--served-model-name", "x"))
    with pytest.raises(BlazrError, match="no such directory"):
        catalog(_config("--models-dir", str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BlazrError, match="no checkpoint"):
        catalog(_config("--models-dir", str(tmp_path / "empty")))


def test_one_cache_budget_is_shared_by_the_models():
    from blazr.engine_config import EngineConfig
    from blazr.state.budget import shared_budget

    gib = 1 << 30
    total = EngineConfig(cache_memory_gib=4.0)  # --cache-memory: the total across loaded models
    assert shared_budget(total, held_bytes=0, num_shares=2) == 2 * gib
    assert shared_budget(total, held_bytes=2 * gib, num_shares=1) == 2 * gib  # what is left
    assert shared_budget(total, held_bytes=5 * gib, num_shares=1) == 0
    auto = shared_budget(EngineConfig(), held_bytes=0, num_shares=1, device="cpu")
    assert 0 < shared_budget(EngineConfig(), held_bytes=0, num_shares=4, device="cpu") < auto


def test_keep_alive_durations():
    assert keep_alive_seconds(None) is None
    assert keep_alive_seconds(0) == 0 and keep_alive_seconds("30s") == 30 and keep_alive_seconds("5m") == 300
    assert keep_alive_seconds("1h") == 3600 and keep_alive_seconds(-1) == float("inf")
    assert keep_alive_seconds("-1") == float("inf") and keep_alive_seconds("250ms") == 0.25


def test_a_bad_models_dir_stops_serve_in_one_line(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "blazr", "serve", "--cpu", "--models-dir", str(tmp_path / "missing")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith("missing: no such directory")
    assert "Traceback" not in done.stderr
