"""Prefix caching as clients see it: `usage.prompt_tokens_details.cached_tokens` on both endpoints (one
body, the final usage chunk, every continuous-usage chunk), the Prometheus counters
`blazr:prefix_cache_queries_total` / `_hits_total`, `--no-prefix-cache`, and the offline API's
`RequestOutput.num_cached_tokens`.

Two layers: the server's accounting in-process over a scripted engine that reports cached tokens (several
prompts, n > 1, role chunks: exact numbers whatever the engine's policy), then the real thing — `blazr
serve` on a tiny Llama and a tiny Mamba2 + attention hybrid with the cache on, and the Llama with it off —
through the official `openai` client and httpx. Every real-server test sends token-id prompts of its own
(seeded), so the tests share a server without sharing cached prefixes.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from blazr.engine.outputs import SeqOutput
from blazr.engine.sampling import SamplingParams
from blazr.server.app import LoadedModel, build_app
from blazr.server.options import ServerConfig
from tests.server_util import ServerProcess, parse_metrics
from tests.test_server_app import FakeEngine, FakeTokenizer
from tests.test_server_sampling import GRANITE
from tests.tiny import build

BLOCK_SIZE = 16  # EngineConfig.block_size: what the server runs with
VOCAB = 100288  # cl100k_base ids fit: chat prompts render to real tokens
QUERIES = "blazr:prefix_cache_queries_total"
HITS = "blazr:prefix_cache_hits_total"
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _cached(usage: dict[str, Any]) -> int:
    details = usage["prompt_tokens_details"]
    assert set(details) == {"cached_tokens"}, details
    return int(details["cached_tokens"])


def _events(text: str) -> list[dict[str, Any]]:
    """A stream's JSON events, `[DONE]` checked and dropped."""
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-1]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


# ------------------------------------------------------------------- the accounting, over a fake engine


class CachingFakeEngine(FakeEngine):
    """FakeEngine with a prefix cache's reporting: a prompt of L tokens has the whole blocks of its first
    L - 1 tokens cached (every output of it says so), counted in the cumulative counters when added; n
    samples each emit their own outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        super().add_request(rid, prompt_ids, params)
        self.cached[rid] = (len(prompt_ids) - 1) // BLOCK_SIZE * BLOCK_SIZE
        self.prefix_cache_queries += len(prompt_ids)
        self.prefix_cache_hits += self.cached[rid]

    def _outputs(
        self, rid: str, ids: list[int], params: SamplingParams, done: int, finished: bool
    ) -> list[SeqOutput]:
        reason = "length" if finished else None
        outs = [SeqOutput(rid, i, [120], "x", [], finished, reason, len(ids), done) for i in range(params.n)]
        for out in outs:
            out.num_cached_tokens = self.cached[rid]
        return outs


@pytest.fixture
def fake() -> Any:
    engine = CachingFakeEngine()

    def loader(cfg: ServerConfig) -> LoadedModel:
        return LoadedModel(engine, FakeTokenizer(), ["fake"], "fake-model")  # type: ignore[arg-type]

    with TestClient(build_app(ServerConfig(), loader)) as client:
        for _ in range(500):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.01)
        yield client, engine


def test_completions_count_each_prompts_cached_tokens_once(fake):
    """Two prompts × n = 3: `cached_tokens` is the prompts' sum (a prompt is prefilled once for its n
    samples), in the body and in the final usage chunk; each continuous chunk carries its own prompt's."""
    client, _ = fake
    prompts = [list(range(1, 21)), list(range(1, 41))]  # 20 and 40 tokens: 16 and 32 cached
    body = {"prompt": prompts, "n": 3, "max_tokens": 4}
    whole = client.post("/v1/completions", json=body).json()
    assert whole["usage"]["prompt_tokens"] == 60 and whole["usage"]["completion_tokens"] == 24
    assert _cached(whole["usage"]) == 48
    events = _events(
        client.post("/v1/completions", json={**body, "stream": True, "stream_options": CONTINUOUS}).text
    )
    *chunks, last = events
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    for c in chunks:
        prompt = c["choices"][0]["index"] // 3
        assert c["usage"]["prompt_tokens"] == len(prompts[prompt])
        assert _cached(c["usage"]) == (16, 32)[prompt]
    final = _events(
        client.post(
            "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ).text
    )
    assert final[-1]["usage"] == whole["usage"] and all(e["usage"] is None for e in final[:-1])


def test_chat_reports_cached_tokens_on_every_usage_and_the_role_chunks_too(fake):
    """With continuous usage the role chunks wait for the engine's first outputs, so they carry the
    prompt's cached tokens like every later chunk; without it they go out at once, usage null."""
    client, _ = fake
    body = {"messages": [{"role": "user", "content": "y" * 37}], "n": 2, "max_tokens": 3}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["usage"]["prompt_tokens"] == 37 and _cached(whole["usage"]) == 32
    r = client.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": CONTINUOUS})
    *chunks, last = _events(r.text)
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [{"role": "assistant", "content": ""}] * 2
    assert [c["usage"]["completion_tokens"] for c in chunks[:2]] == [0, 0]
    assert all(_cached(c["usage"]) == 32 and c["usage"]["prompt_tokens"] == 37 for c in chunks)
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    r = client.post(
        "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    *chunks, last = _events(r.text)
    assert (
        chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        and chunks[0]["usage"] is None
    )
    assert last["usage"] == whole["usage"]
    r = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert all("usage" not in e for e in _events(r.text))


def test_metrics_are_the_engines_cumulative_counts(fake):
    client, engine = fake
    m = parse_metrics(client.get("/metrics").text)
    assert m[QUERIES] == m[HITS] == 0
    client.post("/v1/completions", json={"prompt": [list(range(1, 21)), list(range(1, 41))], "max_tokens": 2})
    m = parse_metrics(client.get("/metrics").text)
    assert (m[QUERIES], m[HITS]) == (60, 48) == (engine.prefix_cache_queries, engine.prefix_cache_hits)
    text = client.get("/metrics").text
    assert f"# TYPE {QUERIES} counter" in text and f"# TYPE {HITS} counter" in text


# -------------------------------------------------------------------------------- the real server


def _ids(seed: int, n: int) -> list[int]:
    """n token ids of their own: ordinary cl100k ids (no special tokens), different for every seed."""
    rng = random.Random(seed)
    return [rng.randrange(300, 90000) for _ in range(n)]


@dataclass
class Served:
    server: ServerProcess
    is_hybrid: bool  # hits resume from a recurrent-state snapshot: at most the attention layers' prefix


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def cached(request, tmp_path_factory):
    """`blazr serve` with the prefix cache on (the default): a pure-attention model and a Mamba2 +
    attention hybrid."""
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        build("LlamaForCausalLM", path, vocab_size=VOCAB)
    else:
        build("GraniteMoeHybridForCausalLM", path, vocab_size=VOCAB, **GRANITE)
    args = ["--model", str(path), "--served-model-name", "m", "--max-model-len", "512", "--num-threads", "1"]
    with ServerProcess(args) as server:
        yield Served(server, request.param == "hybrid")


@pytest.fixture(scope="module")
def uncached(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-off")
    build("LlamaForCausalLM", path, vocab_size=VOCAB)
    args = ["--model", str(path), "--served-model-name", "m", "--max-model-len", "512", "--num-threads", "1"]
    with ServerProcess([*args, "--no-prefix-cache"]) as server:
        yield server


def _complete(served: Served | ServerProcess, prompt: list[int], max_tokens: int = 4, **kw: Any) -> Any:
    """A completion through the official client: greedy and to `max_tokens` unless `kw` says otherwise."""
    server = served.server if isinstance(served, Served) else served
    body = {"temperature": 0, **kw}
    extra_body = {"ignore_eos": True, **body.pop("extra_body", {})}
    return server.client().completions.create(
        model="m", prompt=prompt, max_tokens=max_tokens, extra_body=extra_body, **body
    )


def _completion_ids(out: Any) -> list[int]:
    """The generated token ids of a completion asked with logprobs=0 and return_tokens_as_token_ids."""
    return [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]


def _check_hit(cached_tokens: int, prompt_tokens: int, at_most: int) -> None:
    """A hit as the cache can give it: whole blocks, at most `at_most` (the tokens known to be cached), and
    never the whole prompt (its last token is computed to sample from)."""
    assert cached_tokens > 0, "no hit"
    assert cached_tokens % BLOCK_SIZE == 0, cached_tokens
    assert cached_tokens <= min(at_most, prompt_tokens - 1), (cached_tokens, at_most, prompt_tokens)


def test_the_next_turn_of_a_conversation_is_served_from_the_cache(cached):
    """Turn 2 = turn 1's prompt + its answer + a new message (what chat clients send): turn 1 reports 0
    cached tokens, turn 2 whole blocks of turn 1's sequence — on the hybrid too (a snapshot of the
    recurrent state at a block boundary of turn 1)."""
    turn1 = _ids(1, 150)
    first = _complete(
        cached, turn1, max_tokens=20, logprobs=0, extra_body={"return_tokens_as_token_ids": True}
    )
    assert first.usage.prompt_tokens == 150
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = turn1 + _completion_ids(first) + _ids(2, 30)
    second = _complete(cached, turn2)
    assert second.usage.prompt_tokens == 200
    _check_hit(second.usage.prompt_tokens_details.cached_tokens, 200, at_most=150 + 20 - 1)


def test_a_shared_prefix_is_cached_up_to_its_last_whole_block(cached):
    """Two prompts sharing their first 100 tokens: the second finds 96 of them (6 whole blocks) on the
    pure-attention model; on the hybrid at most that (the deepest state snapshot at or below)."""
    prefix = _ids(3, 100)
    first = _complete(cached, prefix + _ids(4, 20))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = _complete(cached, prefix + _ids(5, 20))
    got = second.usage.prompt_tokens_details.cached_tokens
    if cached.is_hybrid:
        assert got % BLOCK_SIZE == 0 and 0 <= got <= 96
    else:
        assert got == 96


def test_an_exact_repeat(cached):
    prompt = _ids(6, 100)
    assert _complete(cached, prompt).usage.prompt_tokens_details.cached_tokens == 0
    again = _complete(cached, prompt).usage.prompt_tokens_details.cached_tokens
    _check_hit(again, 100, at_most=100)
    if not cached.is_hybrid:
        assert again == 96


def test_streamed_usage_carries_the_cached_tokens(cached):
    """The final usage chunk and every continuous-usage chunk, on both endpoints, say what the same
    request unstreamed says."""
    prompt = _ids(7, 130)
    _complete(cached, prompt)  # primes the cache: every repeat finds the same then
    want = _complete(cached, prompt).usage.prompt_tokens_details.cached_tokens
    _check_hit(want, 130, at_most=130)
    body = {"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    for options in ({"include_usage": True}, CONTINUOUS):
        r = cached.server.post("/v1/completions", json={**body, "stream": True, "stream_options": options})
        *chunks, last = _events(r.text)
        assert last["choices"] == [] and _cached(last["usage"]) == want
        assert last["usage"]["completion_tokens"] == 6
        if options is CONTINUOUS:
            assert chunks and all(_cached(c["usage"]) == want for c in chunks)
    # the official client's view of the final chunk
    stream = cached.server.client().completions.create(
        model="m",
        prompt=prompt,
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = list(stream)[-1].usage
    assert usage is not None and usage.prompt_tokens_details.cached_tokens == want


def test_chat_with_a_shared_system_prompt(cached):
    """Chat requests sharing a long system prompt: the second finds it cached, in its body and in every
    usage of its stream (the role chunks included)."""
    system = {
        "role": "system",
        "content": " ".join(f"rule {i}: answer briefly and politely." for i in range(30)),
    }
    client = cached.server.client()

    def ask(question: str, **kw: Any) -> Any:
        messages = [system, {"role": "user", "content": question}]
        return client.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0, **kw)

    first = ask("What is a fox?")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = ask("Where do owls live?")
    want = second.usage.prompt_tokens_details.cached_tokens
    _check_hit(want, second.usage.prompt_tokens, at_most=first.usage.prompt_tokens)
    chunks = list(ask("Where do owls live?", stream=True, stream_options=CONTINUOUS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is not None for c in chunks)
    # a repeat of `second`: at least what it found, from its own blocks now
    got = {c.usage.prompt_tokens_details.cached_tokens for c in chunks}
    assert len(got) == 1 and got.pop() >= want


def test_n_samples_share_one_prompt_and_report_it_once(cached):
    prompt = _ids(9, 100)
    _complete(cached, prompt)
    one = _complete(cached, prompt).usage
    three = _complete(cached, prompt, n=3, seed=1, temperature=0.8).usage
    assert three.prompt_tokens == one.prompt_tokens == 100 and three.completion_tokens == 12
    assert three.prompt_tokens_details.cached_tokens == one.prompt_tokens_details.cached_tokens > 0


def test_counters_move_by_the_tokens_looked_up_and_found(cached):
    """Δ queries = the prompt tokens looked up (every prompt token of each request), Δ hits = the cached
    tokens the responses reported."""
    before = cached.server.metrics()
    prompt = _ids(10, 90)
    outs = [
        _complete(cached, prompt),
        _complete(cached, prompt + _ids(11, 5)),
        _complete(cached, _ids(12, 40)),
    ]
    after = cached.server.metrics()
    assert after[HITS] - before[HITS] == sum(o.usage.prompt_tokens_details.cached_tokens for o in outs) > 0
    assert after[QUERIES] - before[QUERIES] == sum(o.usage.prompt_tokens for o in outs)
    assert after[HITS] <= after[QUERIES]


def test_no_prefix_cache_reports_zero_and_finds_nothing(uncached):
    prompt = _ids(13, 100)
    for _ in range(2):
        out = _complete(uncached, prompt)
        assert out.usage.prompt_tokens_details.cached_tokens == 0  # present, and 0
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True, "stream_options": CONTINUOUS}
    assert all(_cached(e["usage"]) == 0 for e in _events(uncached.post("/v1/completions", json=body).text))
    assert uncached.metrics()[HITS] == 0
    assert "prefix cache off" in uncached.log_tail(100_000)


def test_the_load_line_says_prefix_caching_is_on(cached):
    assert "prefix cache on" in cached.server.log_tail(100_000)


# ------------------------------------------------------------------------------------ the offline API


def test_llm_num_cached_tokens_and_the_kwarg(tmp_path):
    from blazr import LLM

    build("LlamaForCausalLM", tmp_path, vocab_size=VOCAB)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prefix = _ids(14, 70)
    on = LLM(tmp_path, cpu=True, max_model_len=256)
    assert on.engine_config.enable_prefix_caching
    first, second = (on.generate(prefix + _ids(s, 8), params)[0] for s in (15, 16))
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 64)
    off = LLM(tmp_path, cpu=True, max_model_len=256, enable_prefix_caching=False)
    assert not off.engine_config.enable_prefix_caching
    outs = [off.generate(prefix + _ids(s, 8), params)[0] for s in (15, 16)]
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert [o.outputs[0].token_ids for o in outs] == [first.outputs[0].token_ids, second.outputs[0].token_ids]


def test_echo_with_a_hit(cached, uncached):
    """echo without logprobs keeps its hit (it needs no prompt logits); echo with logprobs scores every
    prompt token, so it computes the whole prompt — and both answer exactly as without the cache."""
    prompt = _ids(14, 100)
    _complete(cached, prompt)
    plain = _complete(cached, prompt, echo=True)
    _check_hit(plain.usage.prompt_tokens_details.cached_tokens, 100, at_most=100)
    scored = _complete(cached, prompt, echo=True, logprobs=1)
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    assert len(scored.choices[0].logprobs.token_logprobs) == 100 + 4
    if not cached.is_hybrid:  # `uncached` serves the same Llama checkpoint
        assert plain.choices[0].text == _complete(uncached, prompt, echo=True).choices[0].text
        want = _complete(uncached, prompt, echo=True, logprobs=1).choices[0].logprobs.token_logprobs
        got = scored.choices[0].logprobs.token_logprobs
        assert got[0] is None and want[0] is None
        assert max(abs(a - b) for a, b in zip(got[1:], want[1:], strict=True)) < 1e-4
