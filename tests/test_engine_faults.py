"""Failure containment in the engine: a request that makes the forward, the sampler or its detokenizer
raise fails alone, and every other request of the batch produces exactly what it produces without it —
on a pure-attention model and on a hybrid (Mamba2 state slots + MLA + MoE), whose recurrent state a failed
step may have half-updated (quarantine recomputes it). An engine whose every forward fails, or whose
device failed, stops with EngineBrokenError instead of failing requests forever."""

from __future__ import annotations

import logging
import random

import pytest

from blazr import LLM, SamplingParams
from blazr.engine.failures import MAX_CONSECUTIVE_FAILURES, EngineBrokenError
from blazr.engine.runner import ModelRunner
from tests.faults import DETOK, FORWARD, SAMPLE, installed
from tests.oxidizr_fixtures import NANO, write_oxidizr
from tests.tiny import build


def _build(kind: str, path) -> LLM:
    if kind == "llama":
        build("LlamaForCausalLM", path)
    else:
        path = write_oxidizr(path, NANO)
    # a small token budget: prefills are chunked and mixed with decodes, so the bomb shares its steps
    return LLM(path, cpu=True, max_model_len=256, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def llm(request, tmp_path_factory) -> LLM:
    return _build(request.param, tmp_path_factory.mktemp(request.param))


def _prompts(num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 500) for _ in range(5 + 7 * i)] for i in range(num)]


def _greedy(n: int = 1, stop: tuple[str, ...] = ()) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, n=n, stop=list(stop))


@pytest.mark.parametrize("marker", [FORWARD, SAMPLE, DETOK])
def test_a_failing_request_fails_alone(llm, marker, caplog):
    prompts = _prompts(6)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())]
    bomb = [7, 8, 9, 10, 11, 12]
    params = [_greedy()] * 3 + [_greedy(n=2, stop=(marker,))] + [_greedy()] * 3
    with caplog.at_level(logging.WARNING, logger="blazr.engine"), installed():
        outs = llm.generate([*prompts[:3], bomb, *prompts[3:]], params)
    assert [c.finish_reason for c in outs[3].outputs] == ["error", "error"]
    innocents = [o.outputs[0] for i, o in enumerate(outs) if i != 3]
    assert [c.token_ids for c in innocents] == alone
    assert all(c.finish_reason == "length" for c in innocents)
    assert f"request {outs[3].request_id} failed" in caplog.text  # the traceback, under its id
    if marker == FORWARD:  # it failed inside a step with others: they were re-run alone, then it alone
        assert "re-running each alone" in caplog.text
    assert llm.engine.scheduler.num_quarantined == 0 and not llm.engine.has_unfinished()
    blocks = llm.engine.cache.blocks
    assert blocks is None or blocks.num_free == blocks.num_blocks
    again = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())]
    assert again == alone  # nothing left behind


def test_an_engine_whose_every_forward_fails_gives_up(tmp_path, monkeypatch):
    llm = _build("llama", tmp_path)

    def broken(self, sched):
        raise RuntimeError("every forward fails")

    monkeypatch.setattr(ModelRunner, "run", broken)
    with pytest.raises(EngineBrokenError, match=f"{MAX_CONSECUTIVE_FAILURES} time"):
        llm.generate(_prompts(MAX_CONSECUTIVE_FAILURES + 2), _greedy())


def test_a_device_failure_is_fatal_at_once(tmp_path, monkeypatch):
    llm = _build("llama", tmp_path)

    def cuda_failure(self, sched):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(ModelRunner, "run", cuda_failure)
    with pytest.raises(EngineBrokenError, match="1 time"):
        llm.generate(_prompts(1), _greedy())
