"""Every sampling parameter through the real server — alone and mixed in one batch, through
/v1/completions and /v1/chat/completions, streamed and not — on the float and the quantized (int8) path of
a pure-attention model (tiny Llama) and of a hybrid (tiny GraniteMoeHybrid: Mamba2 + attention + MoE).

- Each case alone, streamed == not streamed, and again all at once (concurrently) == alone: a parameter
  never leaks into the other requests of its batch. Seeded sampling is compared token for token where the
  model's decode is bitwise batch-invariant (the Llama paths: the fused plan and the quantized kernels);
  the hybrid's eager decode rounds differently at other batch heights (~1e-7), which can flip a draw
  among 100k near-equal candidates, so there a seeded request must reproduce itself alone and stay
  inside its filters when batched.
- Penalties (repetition, presence, frequency, logit_bias, min_tokens) against transformers on the float
  path: at every generated position, the server's token maximises the reference formula
  (tests/sampling_reference.py, vLLM's) applied to transformers' logits for the same history.
- On the quantized path the additive ones (presence, frequency, logit_bias) are checked against the
  server's own raw top-20 logprobs; top-k / top-p / min-p draws stay inside the set the filter allows;
  min_tokens, stop strings, stop_token_ids, n and logprobs keep their contracts.
- Chat: the same parameters give the same tokens as completions on the rendered prompt.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from blazr.detect import inspect_checkpoint
from blazr.engine.sampling import SamplingParams
from blazr.tokenizer import load_tokenizer
from tests.sampling_reference import reference_penalties
from tests.server_util import ServerProcess
from tests.ssm_fixtures import randomise
from tests.tiny import build, hf_logits

VOCAB = 100288  # cl100k_base's ids fit: chat prompts render to real tokens
MAX_TOKENS = 10
PROMPT = [15339, 1917, 11, 358, 1097, 264, 1296, 1646, 13]  # "hello world, I am a test model." in cl100k
CHAT = [{"role": "user", "content": "Tell me a story about a fox."}]
GRANITE = dict(
    mamba_n_heads=8,
    mamba_d_head=32,
    mamba_d_state=16,
    mamba_chunk_size=8,
    mamba_expand=2,
    mamba_n_groups=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=64,
    shared_intermediate_size=96,
    position_embedding_type="rope",
)


@dataclass
class Served:
    server: ServerProcess
    hf: torch.nn.Module | None  # the float reference (None on the quantized path)
    path: Path
    is_batch_invariant: bool  # decode logits bitwise equal whatever shares the step
    chat_ids: list[int] = field(default_factory=list)  # CHAT as the server renders it


def _checkpoint(kind: str, path: Path) -> torch.nn.Module:
    if kind == "llama":
        return build("LlamaForCausalLM", path, vocab_size=VOCAB)
    hf = build("GraniteMoeHybridForCausalLM", path, vocab_size=VOCAB, **GRANITE)
    randomise(hf, 1)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module", params=["llama-float", "llama-int8", "hybrid-float", "hybrid-int8"])
def served(request, tmp_path_factory) -> Served:
    kind, path_kind = request.param.split("-")
    path = tmp_path_factory.mktemp(kind)
    hf = _checkpoint(kind, path)
    # prefills never chunked (a large budget): the quantized path then is batch-invariant too
    args = ["--model", str(path), "--served-model-name", "m", "--num-threads", "1", "--max-model-len", "256"]
    args += [
        "--max-num-batched-tokens",
        "8192",
        "--max-num-seqs",
        "64",
        "--quantize",
        path_kind.replace("float", "none"),
    ]
    tok = load_tokenizer(inspect_checkpoint(path).tokenizer)
    chat_ids = tok.encode_chat(CHAT)
    with ServerProcess(args) as server:
        yield Served(server, hf if path_kind == "float" else None, path, kind == "llama", chat_ids)


# ----------------------------------------------------------------------------------------- the cases


def _cases(greedy_ids: list[int], greedy_text: str) -> dict[str, dict[str, Any]]:
    """Request bodies (without prompt/messages) by case name; some are built from the greedy output."""
    x = greedy_ids[1]  # would end the greedy output at its 2nd token, were it a stop id
    stop = greedy_text[len(greedy_text) // 2 :][:4] or "zzz"
    return {
        "greedy": dict(temperature=0),
        "temperature": dict(temperature=0.8, seed=11),
        # (filters narrow enough that what they allow lies within the top 20 listed logprobs of these
        # near-flat random models: ~1e-3 per top token)
        "top_p": dict(temperature=1.0, top_p=0.003, seed=12, logprobs=20),
        "top_k": dict(temperature=1.0, top_k=5, seed=13, logprobs=5),
        "min_p": dict(temperature=1.0, min_p=0.8, seed=14, logprobs=20),
        "repetition": dict(temperature=0, repetition_penalty=1.8),
        "presence": dict(temperature=0, presence_penalty=1.5, logprobs=20),
        "frequency": dict(temperature=0, frequency_penalty=1.0, logprobs=20),
        "logit_bias": dict(temperature=0, logit_bias={str(greedy_ids[0]): -100, "1000": 2.5}, logprobs=20),
        "logit_bias_force": dict(temperature=0, logit_bias={"777": 100}),
        # a bias that makes 777 win (logits ~N(0, 1)), then a repetition penalty that makes it lose
        "repetition_forced": dict(temperature=0, logit_bias={"777": 8.0}, repetition_penalty=4.0),
        "min_tokens": dict(temperature=0, min_tokens=6, stop_token_ids=[x]),
        "stop_token_ids": dict(temperature=0, stop_token_ids=[x]),
        "stop": dict(temperature=0, stop=[stop]),
        "n": dict(temperature=1.0, n=2, seed=15),
        "everything": dict(
            temperature=0.9,
            top_p=0.95,
            top_k=50,
            min_p=0.01,
            seed=16,
            repetition_penalty=1.2,
            presence_penalty=0.4,
            frequency_penalty=0.3,
            logit_bias={"500": 1.5},
            min_tokens=3,
            n=2,
            stop_token_ids=[x],
        ),
        "penalties_greedy": dict(
            temperature=0,
            repetition_penalty=1.3,
            presence_penalty=0.7,
            frequency_penalty=0.6,
            logit_bias={"42": 2},
        ),
    }


@dataclass
class Choice:
    ids: list[int]
    text: str
    finish_reason: str | None
    top: list[dict[int, float]]  # raw top logprobs per generated token


def _body(endpoint: str, served: Served, case: dict[str, Any], stream: bool) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream, **case}
    body["return_tokens_as_token_ids"] = True
    k = body.pop("logprobs", 2)  # the runner-up too: where two runs part, is it at a near-tie?
    if endpoint == "completions":
        body.update(prompt=PROMPT, logprobs=k)
    else:
        body.update(messages=CHAT, logprobs=True, top_logprobs=k)
    return body


def _same(a: list[Choice], b: list[Choice], tol: float = 1e-4) -> bool:
    """Equal outputs: tokens, text, finish reasons; raw logprobs within `tol` (a prompt prefilled beside
    others goes through GEMMs of another height, whose float sums may round differently). Tokens may
    part only at a near-tie — the two candidates' logprobs within `tol` — and are not compared past it."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for i, (s, t) in enumerate(zip(x.ids, y.ids, strict=False)):
            tx, ty = x.top[i], y.top[i]
            if any(abs(v - ty[k]) >= tol for k, v in tx.items() if k in ty):
                return False
            if s != t:
                return s in ty and t in tx and abs(tx[s] - tx[t]) < tol  # a near-tie: they part here
        if (x.ids, x.text, x.finish_reason) != (y.ids, y.text, y.finish_reason):
            return False
    return True


def _id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


async def _call(http: httpx.AsyncClient, endpoint: str, body: dict[str, Any]) -> list[Choice]:
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    acc: dict[int, Choice] = {}

    def add(c: dict[str, Any]) -> None:
        ch = acc.setdefault(c["index"], Choice([], "", None, []))
        ch.text += (
            c.get("text")
            if endpoint == "completions"
            else (c.get("delta") or c.get("message") or {}).get("content")
        ) or ""
        lp = c.get("logprobs")
        if lp:
            if endpoint == "completions":
                ch.ids += [_id(t) for t in lp["tokens"]]
                ch.top += [{_id(t): v for t, v in (d or {}).items()} for d in lp["top_logprobs"]]
            else:
                for entry in lp["content"] or []:
                    ch.ids.append(_id(entry["token"]))
                    ch.top.append({_id(t["token"]): t["logprob"] for t in entry["top_logprobs"]})
        if c.get("finish_reason"):
            ch.finish_reason = c["finish_reason"]

    if not body["stream"]:
        r = await http.post(path, json=body)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            add(c)
    else:
        async with http.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        for e in events[:-1]:
            chunk = json.loads(e)
            assert "error" not in chunk, chunk
            for c in chunk["choices"]:
                add(c)
    return [acc[i] for i in sorted(acc)]


def _run(served: Served, jobs: list[tuple[str, dict[str, Any]]], together: bool) -> list[list[Choice]]:
    async def go() -> list[list[Choice]]:
        async with httpx.AsyncClient(base_url=served.server.url, timeout=300) as http:
            if together:
                return list(await asyncio.gather(*(_call(http, e, b) for e, b in jobs)))
            return [await _call(http, e, b) for e, b in jobs]

    return asyncio.run(go())


# ------------------------------------------------------------------------------------------ the checks


def _reference_check(served: Served, prompt: list[int], case: dict[str, Any], ids: list[int]) -> None:
    """At every position the server's token maximises the penalised transformers logits."""
    assert served.hf is not None
    params = SamplingParams(
        temperature=0,
        repetition_penalty=case.get("repetition_penalty", 1.0),
        presence_penalty=case.get("presence_penalty", 0.0),
        frequency_penalty=case.get("frequency_penalty", 0.0),
        logit_bias={int(k): v for k, v in case.get("logit_bias", {}).items()},
        min_tokens=case.get("min_tokens", 0),
    )
    logits = hf_logits(served.hf, prompt + ids)[len(prompt) - 1 :]
    stop_ids = set(case.get("stop_token_ids", []))
    for i, token in enumerate(ids):
        ref = reference_penalties(logits[i].tolist(), prompt, ids[:i], params, stop_ids)
        best = max(ref)
        assert ref[token] >= best - 1e-4 * max(1.0, abs(best)), (i, token, ref[token], best)


def _additive_check(case: dict[str, Any], choice: Choice) -> None:
    """Against the server's raw top logprobs: the chosen token beats every listed one after the additive
    penalties (frequency, presence, logit_bias) — their formula is shift-invariant, so logprobs suffice."""
    bias = {int(k): v for k, v in case.get("logit_bias", {}).items()}
    freq, pres = case.get("frequency_penalty", 0.0), case.get("presence_penalty", 0.0)
    for i, (token, top) in enumerate(zip(choice.ids, choice.top, strict=True)):
        counts = Counter(choice.ids[:i])
        value = {
            t: lp + bias.get(t, 0.0) - freq * counts[t] - pres * (counts[t] > 0) for t, lp in top.items()
        }
        if token in value:  # (a listed rival may be outranked after the penalties by an unlisted token)
            assert value[token] >= max(value.values()) - 1e-4, (i, token, value[token], max(value.values()))


def _filter_check(case: dict[str, Any], choice: Choice) -> None:
    """Sampled tokens lie in the set top-k / top-p / min-p allow (temperature 1: raw logprobs are the
    distribution the filters see)."""
    for token, top in zip(choice.ids, choice.top, strict=True):
        ranked = sorted(top.items(), key=lambda kv: -kv[1])
        assert token in top, "a sampled token outside the returned top logprobs"
        if "top_k" in case:
            assert token in dict(ranked[: case["top_k"]])
        if "min_p" in case:
            assert math.exp(top[token]) >= case["min_p"] * math.exp(ranked[0][1]) * (1 - 1e-5)
        if "top_p" in case:
            before = sum(math.exp(lp) for t, lp in ranked if lp > top[token])
            assert before < case["top_p"] + 1e-5


def test_every_parameter_alone_mixed_streamed_and_not(served):
    (greedy,) = _run(
        served, [("completions", _body("completions", served, {"temperature": 0}, False))], False
    )[0:1]
    cases = _cases(greedy[0].ids, greedy[0].text)
    jobs, names = [], []
    for name, case in cases.items():
        for endpoint in ("completions", "chat"):
            for stream in (False, True):
                jobs.append((endpoint, _body(endpoint, served, case, stream)))
                names.append((name, endpoint, stream))
    alone = _run(served, jobs, together=False)
    together = _run(served, jobs, together=True)
    results: dict[tuple[str, str], list[Choice]] = {}
    for (name, endpoint, stream), a, t in zip(names, alone, together, strict=True):
        sampled = cases[name]["temperature"] > 0
        if served.is_batch_invariant or not sampled:
            # the hybrid is not batch-invariant: its MoE experts run float GEMMs whose height is the number
            # of tokens routed to them, and their last-bit differences reach the logits; on the quantized
            # path the next layer's 8-bit activation rounding can turn one into ~1e-2 (one rounding flip:
            # up to amax/254 of a block), a real fault (a row mixed up) moves logprobs by whole units
            tol = 1e-4 if served.is_batch_invariant else 5e-3 if served.hf is not None else 5e-2
            assert _same(a, t, tol), (
                f"{name} via {endpoint} (stream={stream}) differs when batched:\n{a}\n{t}"
            )
        else:
            assert [len(c.ids) for c in a] == [len(c.ids) for c in t], name
            for c in t:
                if name in ("top_k", "top_p", "min_p"):
                    _filter_check(cases[name], c)
        if stream:
            assert _same(a, results[name, endpoint]), f"{name} via {endpoint}: streamed != not streamed"
        results[name, endpoint] = a

    for (name, endpoint), choices in results.items():
        case = cases[name]
        prompt = PROMPT if endpoint == "completions" else served.chat_ids
        assert len(choices) == case.get("n", 1), name
        for c in choices:
            assert c.finish_reason in ("stop", "length"), (name, c)
            assert (c.finish_reason == "length") == (len(c.ids) == MAX_TOKENS) or "stop" in case, (name, c)
            if name == "logit_bias_force":
                assert c.ids == [777] * MAX_TOKENS
            if name == "logit_bias":
                assert greedy[0].ids[0] not in c.ids
            if name == "repetition_forced":
                assert c.ids[0] == 777 and 777 not in c.ids[1:]
            if name in ("min_tokens", "everything"):
                x = case["stop_token_ids"][0]
                assert x not in c.ids[: case["min_tokens"]] and len(c.ids) >= case["min_tokens"]
            plain = results["greedy", endpoint][0]
            if name == "stop_token_ids":  # the stop id ends it: counted and listed (as vLLM), no text
                x = case["stop_token_ids"][0]
                cut = plain.ids.index(x) + 1 if x in plain.ids else len(plain.ids)
                assert c.ids == plain.ids[:cut]
                assert c.finish_reason == ("stop" if x in plain.ids else "length")
            if name == "stop":
                stop = case["stop"][0]
                assert c.text == plain.text.split(stop)[0]
                assert c.finish_reason == ("stop" if stop in plain.text else "length")
            if name in ("top_k", "top_p", "min_p"):
                _filter_check(case, c)
            if served.hf is not None and name in (
                "repetition",
                "repetition_forced",
                "presence",
                "frequency",
                "logit_bias",
                "min_tokens",
                "penalties_greedy",
            ):
                _reference_check(served, prompt, case, c.ids)
            if name in ("presence", "frequency", "logit_bias"):
                _additive_check(case, c)
    # chat applies the same parameters as completions on the rendered conversation
    for name in ("greedy", "penalties_greedy", "temperature"):
        body = _body("completions", served, cases[name], False)
        body["prompt"] = served.chat_ids
        (via_completions,) = _run(served, [("completions", body)], False)
        assert [c.ids for c in via_completions] == [c.ids for c in results[name, "chat"]], name
    assert results["greedy", "completions"][0].ids == greedy[0].ids
    assert httpx.get(f"{served.server.url}/health").json() == {"status": "ok"}
