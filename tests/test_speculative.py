"""Speculative decoding (engine/speculative.py, engine/ngram.py): speculation on == off, token for token and
logprobs within float tolerance, for every kind of cache — paged attention (Llama), MLA + MoE (DeepSeek-V3),
Mamba2, Mamba2 + attention (GraniteMoeHybrid), gated DeltaNet (Qwen3.5), short conv (LFM2), Mamba1
(Falcon-Mamba, Jamba), KDA + MLA (Kimi-Linear) — with drafts that are wrong at every position in turn (so
each rollback point is exercised: nothing kept, some kept, all kept), with a seed at temperature > 0, n > 1,
a prefix-cache hit and preemption; the target distribution kept under unseeded sampling (a statistical
test against the model's own probabilities); and on the embedded SmolLM2 with real n-gram drafts:
structured output (drafts masked by the grammar), stop strings and logprobs. The n-gram index and the
adaptive draft length are unit-tested.
"""

from __future__ import annotations

import itertools
import math
import threading
import uuid
from pathlib import Path

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import EngineConfig, SpeculativeConfig
from blazr.engine.grammar import StructuredOutput
from blazr.engine.ngram import NgramIndex
from blazr.engine.sequence import Sequence
from blazr.engine.speculative import STALE_STEPS, ReplaySource, Speculator, StepCosts, best_length
from blazr.errors import BlazrError
from tests.ssm_fixtures import randomise, single_thread
from tests.test_prefix_cache import ARCHS, BS, Result, assert_same, run, tokens
from tests.tiny import build

K = 4
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


# -------------------------------------------------------------------------------------------- units


def test_ngram_index_continues_the_latest_longest_match():
    ix = NgramIndex(2, 4)
    ix.extend([1, 2, 3, 4, 5, 1, 2])
    assert ix.propose(3) == [3, 4, 5]  # "1 2" recurs: what followed it
    ix.extend([9, 1, 2])
    assert ix.propose(2) == [9, 1]  # the latest occurrence of "1 2" now
    ix.extend([3])
    assert ix.propose(2) == [4, 5]  # the longest recurring suffix, "1 2 3", continued


def test_ngram_index_goes_on_periodically_and_never_matches_itself():
    ix = NgramIndex(2, 3)
    ix.extend([7, 1, 2, 1, 2, 1])
    assert ix.propose(5) == [2, 1, 2, 1, 2]
    fresh = NgramIndex(2, 3)
    fresh.extend([5, 6, 7, 8])
    assert fresh.propose(4) == []  # no bigram recurs: the suffix is not its own match
    assert NgramIndex(1, 2).propose(3) == []


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", 0, tokens, SamplingParams(), frozenset())


def test_the_adaptive_length_follows_what_pays():
    assert [best_length(a / 10, 4, 0.15) for a in range(11)] == [0, 0, 0, 1, 1, 2, 2, 3, 4, 4, 4]
    assert best_length(0.5, 4, 0.3) < best_length(0.5, 4, 0.15)  # dearer rows: shorter drafts
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=4, ngram_min=1, ngram_max=2), row_cost=0.15)
    seq = _seq([1, 2, 3, 1, 2, 3, 1, 2])

    def propose(limit: int = 8) -> list[int]:
        return spec.propose([(seq, limit)]).get(seq.seq_id, [])

    assert propose() == [3, 1]  # the prior, α = 0.6
    assert propose(1) == [3]  # at most the limit
    kept = 0
    for _ in range(3):
        spec.record(seq, len(d := propose()), len(d))
        kept += len(d)
    assert len(propose()) == 4  # every draft kept: the longest
    lengths = []
    for _ in range(60):  # nothing kept from now on: shorter drafts, then one-token probes ever further apart
        lengths.append(len(d := propose()))
        if d:
            spec.record(seq, len(d), 0)
    assert lengths[:3] == sorted(lengths[:3], reverse=True) and lengths[0] >= 3
    probes = [i for i, n in enumerate(lengths) if n == 1]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert set(lengths[-40:]) <= {0, 1} and gaps[-1] > gaps[-2] > 4, lengths  # 4, 8, 16 steps skipped
    assert spec.stats.accepted_per_position[0] == 3 and spec.stats.num_accepted_tokens == kept
    assert propose(0) == []


def test_the_adaptive_length_follows_measured_step_costs():
    """Rows cost what the host's steps measured: a kernel that takes a second pass over its weights from
    the 9th row makes a draft of 8 dearer than one of 7, and the length chosen follows the measurement."""
    costs = StepCosts(row_cost=0.15)
    assert costs.factor(1, 4) == pytest.approx(1.6)  # nothing measured: the prior β
    costs.observe(5, 0.5)  # a batch size's first step (its plan recorded): not a sample
    assert costs.time(5) is None and costs.factor(1, 4) == pytest.approx(1.6)
    for rows, ms in ((1, 10.0), (2, 10.5), (5, 12.0), (8, 13.0), (9, 26.0)):
        for _ in range(6):
            costs.observe(rows, ms / 1e3)
    costs.observe(5, 0.4)  # one slow step (the host busy): the median holds
    assert costs.factor(1, 4) == pytest.approx(1.2)
    assert costs.factor(1, 7) == pytest.approx(1.3)
    assert costs.factor(1, 8) == pytest.approx(2.6)
    assert costs.factor(1, 5) == pytest.approx(1.2 + 0.15)  # unmeasured: the nearest below, plus β a row
    assert costs.factor(2, 1) == pytest.approx(1.15)  # 2 sequences: t(2) known, t(4) not: t(2) + 2·β·t(2)/2
    assert best_length(0.95, 8, lambda d: costs.factor(1, d)) == 7
    assert best_length(0.95, 8, 0.15) == 8  # the linear prior would take the dear 9th row
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=8, ngram_min=1, ngram_max=2))
    seq = _seq([1, 2, 3, 1, 2, 3, 1, 2])
    for _ in range(5):
        d = spec.propose([(seq, 16)])[seq.seq_id]
        spec.record(seq, len(d), len(d))
    assert len(spec.propose([(seq, 16)])[seq.seq_id]) == 8
    for rows, ms in ((1, 10.0), (9, 40.0), (5, 11.0)):
        for _ in range(3):
            spec.observe_step(rows, ms / 1e3)
    assert len(spec.propose([(seq, 16)])[seq.seq_id]) < 8  # 9 rows measured dear
    for _ in range(STALE_STEPS + 1):
        spec.observe_step(1, 0.01)
    assert spec.costs.time(9) is None  # not seen for long: unmeasured again, so tried again
    assert len(spec.propose([(seq, 16)])[seq.seq_id]) == 8


# -------------------------------------------------------------------------------- every cache kind


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    paths = {}
    for name, (arch, overrides) in ARCHS.items():
        path = paths[name] = tmp_path_factory.mktemp(name)
        hf = build(arch, path, seed=3, **overrides)
        randomise(hf, 4)
        hf.save_pretrained(path)
    return paths


def load(path: Path, spec: SpeculativeConfig | None, **engine) -> LLM:
    limits = dict(
        max_num_seqs=8, max_model_len=512, block_size=BS, cache_memory_gib=0.25, state_snapshot_interval=2
    )
    cfg = EngineConfig(**{**limits, **engine}, speculative=spec)
    return LLM(path, cpu=True, dtype="float32", engine_config=cfg)


def replaying(
    llm: LLM, known: dict[tuple[int, ...], list[int]], wrong_at=lambda i: i % (K + 1)
) -> Speculator:
    """Drafts from the known continuation, wrong at position i % (K + 1) of the i-th draft (K + 1: none)."""
    spec = llm.engine.speculator
    assert spec is not None
    spec.source = ReplaySource(known, llm.config.vocab_size, wrong_at)
    return spec


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request, checkpoints) -> tuple[str, LLM, LLM]:
    """(name, speculation off, speculation on with every draft kept: adaptive off)."""
    path = checkpoints[request.param]
    on = load(path, SpeculativeConfig(num_speculative_tokens=K, adaptive=False))
    return request.param, load(path, None), on


def test_rejections_at_every_position_give_the_same_tokens(pair):
    name, off, on = pair
    prompts = [tokens(20, 1), tokens(37, 2), tokens(5, 3)]
    want = run(off, prompts, GREEDY)
    spec = replaying(on, {tuple(p): r.token_ids[0] for p, r in zip(prompts, want, strict=True)})
    before = (
        spec.stats.num_draft_tokens,
        spec.stats.num_accepted_tokens,
        list(spec.stats.accepted_per_position),
    )
    got = run(on, prompts, GREEDY)
    assert_same(got, want)
    drafted, accepted = spec.stats.num_draft_tokens - before[0], spec.stats.num_accepted_tokens - before[1]
    per_position = [a - b for a, b in zip(spec.stats.accepted_per_position, before[2], strict=True)]
    assert drafted > 0 and 0 < accepted < drafted, name
    assert all(n > 0 for n in per_position), per_position  # all four positions were kept at least once


def test_a_seed_gives_the_same_samples(pair):
    _, off, on = pair
    params = SamplingParams(max_tokens=16, temperature=0.8, top_k=0, top_p=1.0, seed=7, ignore_eos=True, n=2)
    prompts = [tokens(24, 5)]
    want = run(off, prompts, params)
    known = {tuple(prompts[0]): want[0].token_ids[0]}  # sample 0's tokens: sample 1 is drafted wrong
    replaying(on, known, wrong_at=lambda i: None)
    got = run(on, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_preemption(checkpoints):
    path = checkpoints["granite-hybrid"]
    prompts = [tokens(40, s) for s in range(6)]
    off = load(path, None, num_kv_blocks=14)  # 6 sequences of ~64 tokens in 14 blocks: preemptions
    want = run(off, prompts, GREEDY)
    on = load(path, SpeculativeConfig(num_speculative_tokens=K, adaptive=False), num_kv_blocks=14)
    replaying(on, {tuple(p): r.token_ids[0] for p, r in zip(prompts, want, strict=True)})
    assert_same(run(on, prompts, GREEDY), want)
    assert on.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("name", ["llama", "granite-hybrid"])
def test_a_prefix_cache_hit(checkpoints, name):
    """A prompt, then the same prompt followed by its answer and more (the next turn): the second is served
    from the cache the first left — speculated steps included — and gives the tokens it gives alone."""
    path = checkpoints[name]
    first = tokens(40, 11)
    off = load(path, None, enable_prefix_caching=False)
    answer = run(off, [first], GREEDY)[0].token_ids[0]
    turn = first + answer + tokens(9, 12)
    want = run(off, [turn], GREEDY)
    on = load(path, SpeculativeConfig(num_speculative_tokens=K, adaptive=False))
    replaying(on, {tuple(first): answer, tuple(turn): want[0].token_ids[0]})
    assert run(on, [first], GREEDY)[0].token_ids[0] == answer
    got = run(on, [turn], GREEDY)
    assert got[0].token_ids == want[0].token_ids
    assert got[0].num_cached_tokens >= 32, got[0].num_cached_tokens


# ------------------------------------------------------------------------------------- distribution


def _samples(llm: LLM, prompt: list[int], params: SamplingParams, n: int) -> list[list[int]]:
    rids = [uuid.uuid4().hex for _ in range(n)]
    out: dict[str, list[int]] = {r: [] for r in rids}
    for r in rids:
        llm.engine.add_request(r, prompt, params)
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            out[o.request_id] += o.token_ids
    return list(out.values())


def test_unseeded_sampling_keeps_the_target_distribution(checkpoints):
    """The prompt's first token g is drawn at prefill; the next step carries drafts (a, b), a and b the
    most likely tokens after g and after g a. Among the samples that drew g, the second token must be
    distributed as the model's p(· | prompt g), and among those that also drew a, the third as
    p(· | prompt g a) — checked against the model's own probabilities (binomial 4.5-sigma bounds on every
    token of probability ≥ 2 %, and on the rest together). Drafts after another first token are simply
    wrong ones."""
    path = checkpoints["granite-hybrid"]
    llm = load(path, SpeculativeConfig(num_speculative_tokens=2, adaptive=False), max_num_seqs=16)
    prompt, temperature = tokens(12, 9), 0.2
    with torch.inference_mode():
        p0 = torch.softmax(_next_logits(llm, prompt) / temperature, -1)
        g = int(p0.argmax())
        p1 = torch.softmax(_next_logits(llm, [*prompt, g]) / temperature, -1)
        a = int(p1.argmax())
        p2 = torch.softmax(_next_logits(llm, [*prompt, g, a]) / temperature, -1)
        b = int(p2.argmax())
    assert float(p0[g]) > 0.5 and all(0.15 < float(p) < 0.85 for p in (p1[a], p2[b])), (p0[g], p1[a], p2[b])
    spec = llm.engine.speculator
    assert spec is not None
    spec.source = ReplaySource({tuple(prompt): [g, a, b]}, llm.config.vocab_size)
    params = SamplingParams(max_tokens=3, temperature=temperature, top_k=0, top_p=1.0, ignore_eos=True)
    samples = _samples(llm, prompt, params, 1200)
    stats = spec.stats
    assert stats.num_drafts == 1200 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    after_g = [t for t in samples if t[0] == g]
    _check(torch.tensor([t[1] for t in after_g]), p1)
    _check(torch.tensor([t[2] for t in after_g if t[1] == a]), p2)


def _next_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    from blazr.state.batch import ForwardBatch

    model = llm.runner.model
    hidden = model(torch.tensor(ids), ForwardBatch.prefill([len(ids)]), None)
    return model.compute_logits(hidden[-1:], decode=False)[0].float()


def _check(samples: torch.Tensor, p: torch.Tensor) -> None:
    n = samples.numel()
    counts = torch.bincount(samples, minlength=p.numel()).double()
    big = p >= 0.02
    for t in [*big.nonzero().flatten().tolist(), None]:
        q = float(p[t]) if t is not None else float(p[~big].sum())
        c = float(counts[t]) if t is not None else float(counts[~big].sum())
        sigma = math.sqrt(max(n * q * (1 - q), 1.0))
        assert abs(c - n * q) <= 4.5 * sigma, (t, c, n * q)


# --------------------------------------------------------------------------- SmolLM2, real n-gram drafts


@pytest.fixture(scope="module")
def smollm2() -> tuple[LLM, LLM]:
    cfg = EngineConfig(max_num_seqs=4, max_model_len=1024)
    off = LLM(None, engine_config=cfg)
    on = LLM(
        None, engine_config=EngineConfig(max_num_seqs=4, max_model_len=1024, speculative=SpeculativeConfig())
    )
    return off, on


CODE = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(10))\n"


def _chat(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def _texts(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[Result]:
    return run(llm, prompts, params)


def test_copying_with_real_drafts_stop_strings_and_logprobs(smollm2):
    off, on = smollm2
    prompts = [_chat(off, "Copy this code exactly:\n" + CODE), _chat(off, "Repeat after me: " + CODE)]
    params = SamplingParams(max_tokens=60, temperature=0.0, logprobs=3, stop=["fib(10)"])
    spec = on.engine.speculator
    assert spec is not None
    accepted = spec.stats.num_accepted_tokens
    want = [off.generate(p, params)[0] for p in prompts]
    got = on.generate(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.text == w.text and g.outputs[0].finish_reason == w.outputs[0].finish_reason
        lp_g = torch.tensor([lp.logprob for lp in g.outputs[0].logprobs])
        lp_w = torch.tensor([lp.logprob for lp in w.outputs[0].logprobs])
        assert torch.allclose(lp_g, lp_w, atol=1e-4)
        top_g = [[i for i, _ in lp.top] for lp in g.outputs[0].logprobs]
        assert top_g == [[i for i, _ in lp.top] for lp in w.outputs[0].logprobs]
    assert spec.stats.num_accepted_tokens - accepted >= 20  # the copy was mostly drafted


def test_structured_output_masks_the_drafts(smollm2):
    off, on = smollm2
    prompt = _chat(off, "Write the word abc five times, separated by commas.")
    params = SamplingParams(
        max_tokens=40, temperature=0.0, structured=StructuredOutput(regex="(abc, ){4}abc")
    )
    spec = on.engine.speculator
    assert spec is not None
    drafted = spec.stats.num_draft_tokens
    want = off.generate(prompt, params)[0]
    got = on.generate(prompt, params)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids and got.text == "abc, abc, abc, abc, abc"
    assert spec.stats.num_draft_tokens > drafted


# ------------------------------------------------------------------------------------------ a draft model


@pytest.mark.parametrize("draft_seed", [3, 8])
def test_a_draft_model(checkpoints, tmp_path, draft_seed):
    """Llama drafted by itself (seed 3: every draft kept) and by another random Llama of the same vocabulary
    (seed 8: most rejected): the target's tokens either way."""
    target = checkpoints["llama"]
    if draft_seed == 3:
        draft = target
    else:
        arch, overrides = ARCHS["llama"]
        draft = tmp_path / "draft"
        hf = build(arch, draft, seed=draft_seed, **overrides)
        randomise(hf, draft_seed)
        hf.save_pretrained(draft)
    prompts = [tokens(20, 1), tokens(9, 4)]
    want = run(load(target, None), prompts, GREEDY)
    on = load(target, SpeculativeConfig(method="draft", draft_model=str(draft), adaptive=False))
    assert on.draft is not None and on.draft.engine.speculator is None
    got = run(on, prompts, GREEDY)
    assert_same(got, want)
    spec = on.engine.speculator
    assert spec is not None and spec.stats.num_draft_tokens > 0
    if draft_seed == 3:
        assert spec.stats.num_accepted_tokens == spec.stats.num_draft_tokens
    else:
        assert spec.stats.num_accepted_tokens < spec.stats.num_draft_tokens


def test_a_draft_model_of_another_vocabulary_is_refused(checkpoints, tmp_path):
    arch, overrides = ARCHS["llama"]
    draft = tmp_path / "big-vocab"
    build(arch, draft, seed=1, **{**overrides, "vocab_size": 2048})
    with pytest.raises(BlazrError, match="vocabulary"):
        load(checkpoints["llama"], SpeculativeConfig(method="draft", draft_model=str(draft)))


# ------------------------------------------------------------------------------------- the real server


def test_the_server_with_ngram_speculation(smollm2):
    """`blazr serve --speculative ngram` (the app with its real loader): chat completions — streamed and
    whole, a JSON-schema one and an n = 2 seeded one — sent together answer as the same requests do alone
    without speculation; /metrics counts the drafts (vLLM's names)."""
    import concurrent.futures as cf
    import json as _json

    from fastapi.testclient import TestClient

    from blazr.server.app import build_app
    from blazr.server.options import ServerConfig
    from tests.server_util import parse_metrics

    off, _ = smollm2
    copy = [{"role": "user", "content": "Copy this code exactly:\n" + CODE}]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    bodies = [
        {"messages": copy, "max_tokens": 48, "temperature": 0},
        {"messages": copy, "max_tokens": 48, "temperature": 0, "stream": True},
        {"messages": [{"role": "user", "content": "Give a JSON object with a key a."}], "max_tokens": 30,
         "temperature": 0, "response_format": {"type": "json_schema",
                                               "json_schema": {"name": "x", "schema": schema}}},
        {"messages": copy, "max_tokens": 24, "temperature": 0.8, "seed": 5, "n": 2},
    ]  # fmt: skip
    cfg = ServerConfig.of(max_num_seqs=4, max_model_len=1024, speculative="ngram")
    with TestClient(build_app(cfg)) as client:
        for _ in range(3000):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.01)

        def ask(body: dict) -> list[str]:
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            if not body.get("stream"):
                return [c["message"]["content"] for c in r.json()["choices"]]
            chunks = [_json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
            return ["".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])]

        with cf.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, bodies))
        metrics = parse_metrics(client.get("/metrics").text)
    for body, got in zip(bodies, together, strict=True):
        n = body.get("n", 1)
        params = SamplingParams(
            max_tokens=body["max_tokens"], temperature=body["temperature"], top_p=1.0, top_k=0,
            seed=body.get("seed"), n=n,
            structured=StructuredOutput(json_schema=schema) if "response_format" in body else None,
        )  # fmt: skip
        want = off.chat(body["messages"], params)[0]
        assert got == [o.text for o in want.outputs], body
    assert metrics["blazr:spec_decode_num_drafts_total"] > 0
    assert (
        0
        < metrics["blazr:spec_decode_num_accepted_tokens_total"]
        <= metrics["blazr:spec_decode_num_draft_tokens_total"]
    )
    assert metrics['blazr:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] > 0
