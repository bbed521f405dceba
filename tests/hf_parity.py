"""The acceptance checks every HF architecture runs against transformers, shared by the per-family test
files: logits on mixed-length prompts, greedy tokens with caches, cache invariants (prefill + N steps,
chunked prefill 7 and 64, different schedules in one batch) and batched == alone — each a function, and
all four as the tests of `ParityTests` (a family's module subclasses it, beside its `pair` fixture)."""

from __future__ import annotations

import random

import torch

from blazr import LLM, SamplingParams
from tests.drive import assert_logits_close, chunked, full_logits, stepwise_logits
from tests.tiny import hf_greedy, hf_logits


def prompts(lengths: list[int], seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def check_logits(hf: torch.nn.Module, llm: LLM, rel: float = 1e-4) -> None:
    batch = prompts([5, 17, 40, 9], seed=1, vocab=llm.config.vocab_size)
    for p, ours in zip(batch, full_logits(llm.runner, batch), strict=True):
        assert_logits_close(ours, hf_logits(hf, p), rel)


def check_greedy(hf: torch.nn.Module, llm: LLM, n: int = 32) -> None:
    prompt = prompts([11], seed=2, vocab=llm.config.vocab_size)[0]
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == hf_greedy(hf, prompt, n)


def check_cache_invariants(llm: LLM, rel: float = 1e-4) -> None:
    batch = prompts([70, 33, 12], seed=4, vocab=llm.config.vocab_size)
    ref = full_logits(llm.runner, batch)
    plans = {
        "prefill+steps": [[len(p) - 10] + [1] * 10 for p in batch],
        "chunk7": [chunked(len(p), 7) for p in batch],
        "chunk64": [chunked(len(p), 64) for p in batch],
        "mixed": [[40, 5, 1, 1, 23], [1] * 33, [12]],
    }
    for name, plan in plans.items():
        for got, want in zip(stepwise_logits(llm, batch, plan), ref, strict=True):
            try:
                assert_logits_close(got, want, rel)
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from None


def check_batched_equals_alone(llm: LLM) -> None:
    batch = prompts([3, 21, 8, 30], seed=3, vocab=llm.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    together = [r.outputs[0].token_ids for r in llm.generate(batch, params)]
    assert together == [llm.generate([p], params)[0].outputs[0].token_ids for p in batch]


class ParityTests:
    """The four checks as tests, for a module with a `pair` fixture (tests.ssm_fixtures.Pair: .hf, .llm):
    `class TestParity(ParityTests): pass`."""

    def test_logits_match_transformers(self, pair) -> None:
        check_logits(pair.hf, pair.llm)

    def test_greedy_tokens_match_transformers_with_cache(self, pair) -> None:
        check_greedy(pair.hf, pair.llm)

    def test_cache_invariants(self, pair) -> None:
        check_cache_invariants(pair.llm)

    def test_batched_generation_equals_each_alone(self, pair) -> None:
        check_batched_equals_alone(pair.llm)
