"""The sampler against plain, loop-by-loop references of the formulas vLLM documents.

Penalties (vLLM's order: logit_bias, then repetition over prompt ∪ output — positive logits divided, the
rest multiplied — then OpenAI's frequency and presence over the output); stop ids masked before
min_tokens; temperature → min-p → top-k → top-p filtering; seeded draws reproducible and batch-invariant;
the exponential-race draw following the filtered distribution; the caller's logits never modified (also
for inference tensors, the engine's case). The same formulas are checked through the server in
test_server_sampling.py.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from blazr.engine.detokenizer import Detokenizer
from blazr.engine.sampling import SampleRequest, SamplingParams, filtered_distribution, sample
from tests.sampling_reference import reference_distribution, reference_penalties

V = 40


def _row(
    params: SamplingParams, prompt: list[int], output: list[int], stop: set[int], seed: int | None = None
):
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SampleRequest(params, prompt, output, gen, frozenset(stop))


def test_penalties_match_the_reference_formula():
    rng = random.Random(0)
    torch.manual_seed(0)
    rows, refs = [], []
    logits = torch.randn(24, V) * 3
    for b in range(24):
        params = SamplingParams(
            temperature=0,
            repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]),
            presence_penalty=rng.choice([0.0, -1.0, 0.5, 2.0]),
            frequency_penalty=rng.choice([0.0, 1.0, -0.5]),
            logit_bias={rng.randrange(V): rng.uniform(-100, 100) for _ in range(rng.randrange(3))},
            min_tokens=rng.choice([0, 0, 3]),
        )
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 8))]
        output = [rng.randrange(V) for _ in range(rng.randrange(0, 6))]
        stop = {rng.randrange(V), rng.randrange(V)}
        rows.append(_row(params, prompt, output, stop))
        refs.append(reference_penalties(logits[b].tolist(), prompt, output, params, stop))
    before = logits.clone()
    result = sample(logits, rows)
    assert torch.equal(logits, before), "sample() modified the caller's logits"
    for b, ref in enumerate(refs):
        best = max(range(V), key=lambda i: ref[i])
        assert result.token_ids[b] == best, f"row {b}: {result.token_ids[b]} vs reference {best}"
    from blazr.engine.sampling import apply_penalties

    got = apply_penalties(logits.clone(), rows)
    want = torch.tensor(refs, dtype=torch.float32)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-6, atol=1e-5)


def test_repetition_penalty_counts_the_prompt_and_frequency_only_the_output():
    logits = torch.tensor([[2.0, -1.0, 1.0, 0.5]])
    p = SamplingParams(temperature=0, repetition_penalty=4.0)
    assert sample(logits, [_row(p, [0], [], set())]).token_ids == [2]  # 2/4 < 1: the prompt token dropped
    p = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert sample(logits, [_row(p, [2], [], set())]).token_ids == [0]  # prompt tokens are not counted
    assert sample(logits, [_row(p, [], [0], set())]).token_ids == [2]  # 2 - 2·1 = 0 < 1


def test_min_tokens_masks_stop_ids_until_reached():
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    p = SamplingParams(temperature=0, min_tokens=2)
    assert sample(logits, [_row(p, [1], [1], {0})]).token_ids == [1]  # 1 output < 2: EOS masked
    assert sample(logits, [_row(p, [1], [1, 1], {0})]).token_ids == [0]


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=1.0, top_p=1.0, top_k=0),
        dict(temperature=0.7, top_k=5, top_p=1.0),
        dict(temperature=1.3, top_p=0.6, top_k=0),
        dict(temperature=1.0, min_p=0.2, top_p=1.0, top_k=0),
        dict(temperature=0.5, min_p=0.05, top_k=8, top_p=0.9),
        dict(temperature=2.0, top_k=1, top_p=1.0),
    ],
)
def test_filtered_distribution_matches_the_reference(kw):
    torch.manual_seed(1)
    logits = torch.randn(3, V) * 2
    params = SamplingParams(**kw)
    rows = [_row(params, [0], [], set()) for _ in range(3)]
    probs, ids = filtered_distribution(logits, rows)
    for b in range(3):
        got: dict[int, float] = {}
        total = float(probs[b].sum())
        for q, i in zip(probs[b].tolist(), ids[b].tolist(), strict=True):
            if q > 0:
                got[i] = q / total
        want = reference_distribution(logits[b].tolist(), params)
        assert set(got) == set(want)
        for i in want:
            assert got[i] == pytest.approx(want[i], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "kw, scale",
    [
        (dict(temperature=1.0, top_p=0.95, top_k=0), 0.05),  # flat: the nucleus needs most of V (K grows)
        (dict(temperature=1.0, top_p=0.9, top_k=0), 6.0),  # peaked: it fits in the first candidates
        (dict(temperature=0.8, top_p=0.5, top_k=3000), 0.05),  # top-k above the first try, top-p inside it
        (dict(temperature=1.0, top_p=0.7, min_p=0.3, top_k=0), 0.5),
    ],
)
def test_top_p_over_a_large_vocabulary_matches_the_reference(kw, scale):
    """The sampler ranks only as many candidates as top-p needs (growing the set when the nucleus does
    not fit): the kept set and its probabilities equal the full-sort reference."""
    big = 20_000
    torch.manual_seed(2)
    logits = torch.randn(2, big) * scale
    params = SamplingParams(**kw)
    probs, ids = filtered_distribution(logits, [_row(params, [0], [], set()) for _ in range(2)])
    for b in range(2):
        total = float(probs[b].sum())
        got = {i: q / total for q, i in zip(probs[b].tolist(), ids[b].tolist(), strict=True) if q > 0}
        want = reference_distribution(logits[b].tolist(), params)
        assert set(got) == set(want)
        for i in want:
            assert got[i] == pytest.approx(want[i], rel=1e-3, abs=1e-7)
    if scale < 0.1 and params.top_k == 0:
        assert probs.shape[1] > 1000  # the nucleus was larger than the first try


def test_seeded_draws_follow_the_distribution_and_are_batch_invariant():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * 4]))
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0)
    gen = torch.Generator().manual_seed(7)
    counts = Counter(
        sample(logits, [SampleRequest(params, [0], [], gen, frozenset())]).token_ids[0] for _ in range(4000)
    )
    for token, p in enumerate([0.5, 0.3, 0.15, 0.05]):
        assert abs(counts[token] / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000), counts
    # a seeded row gives the same tokens alone or beside rows with other top-k (its random stream is its
    # own), over several steps
    wide = torch.randn(6, V)
    mixed = [SamplingParams(temperature=1.0, top_k=k, top_p=1.0) for k in (3, 0, 7, 1, 0, 12)]
    gens = [torch.Generator().manual_seed(s) for s in range(6)]
    solo = [torch.Generator().manual_seed(s) for s in range(6)]
    for _ in range(20):
        rows = [SampleRequest(p, [0], [], g, frozenset()) for p, g in zip(mixed, gens, strict=True)]
        together = sample(wide, rows).token_ids
        alone = [
            sample(wide[b : b + 1], [SampleRequest(mixed[b], [0], [], solo[b], frozenset())]).token_ids[0]
            for b in range(6)
        ]
        assert together == alone


def test_inference_tensors_are_fine():
    with torch.inference_mode():
        logits = torch.randn(2, V)
    p = SamplingParams(temperature=0, repetition_penalty=1.5, logit_bias={3: 5.0}, min_tokens=1)
    rows = [_row(p, [1, 2], [], {0}), _row(SamplingParams(temperature=0.8, seed=1), [1], [], set())]
    assert len(sample(logits, rows).token_ids) == 2


class _Chars:
    """A stream decoder where token id i is chr(i)."""

    def add(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


def test_stop_strings_count_only_after_min_tokens():
    detok = Detokenizer(_Chars(), ["ab"])
    assert detok.add(ord("a"), check_stop=False) == ("a", False)  # emitted at once, never searched
    assert detok.add(ord("b")) == ("", False)  # "ab" straddles emitted text: no stop (1 char held back)
    assert detok.add(ord("a")) == ("b", False)
    assert detok.add(ord("b")) == ("", True)
    assert detok.text == "ab"  # cut at the stop


def test_greedy_and_drawn_rows_in_one_batch():
    """A batch mixing greedy rows with seeded drawn ones (plain and ranked): greedy rows give the argmax, each
    drawn row the token it draws alone from the same seed."""
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(4)) * 2
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),  # top-k 40, top-p 0.9
        SamplingParams(temperature=1.2, min_p=0.05, top_k=0, top_p=1.0),
    ]

    def rows(seeded: list[int]) -> list[SampleRequest]:
        return [
            SampleRequest(p, [0], [], torch.Generator().manual_seed(s), frozenset())
            for p, s in zip(params, seeded, strict=True)
        ]

    together = sample(logits, rows([0, 1, 2, 3, 4])).token_ids
    for b in (0, 2):
        assert together[b] == int(logits[b].argmax())
    for b in (1, 3, 4):
        alone = sample(logits[b : b + 1], [rows([0, 1, 2, 3, 4])[b]]).token_ids[0]
        assert together[b] == alone
