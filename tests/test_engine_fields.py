"""The engine's side of today's request fields, without a model: a thinking budget's counter (when it forces
the end marker, from where, and that a block the prompt opened or the output opens is counted, never a
later one), the waiting queue's priority order, and cache salts as prefix-hash namespaces."""

from __future__ import annotations

from blazr.config import EngineConfig
from blazr.engine.sampling import SamplingParams
from blazr.engine.scheduler import Scheduler
from blazr.engine.sequence import Sequence
from blazr.engine.thinking import ThinkingBudget, ThinkingCounter
from blazr.state.prefix import ROOT, extend_hashes, hash_root

START, END = (1, 2), (3, 4)  # <think> and </think> as two tokens each


def _run(counter: ThinkingCounter, model: list[int]) -> list[int]:
    """The output when the model would write `model` token by token and the counter forces its turns."""
    out: list[int] = []
    for token in model:
        forced = counter.forced()
        chosen = token if forced is None else forced
        counter.advance(chosen)
        out.append(chosen)
    return out


def test_a_budget_forces_the_end_marker_after_n_tokens():
    opened = ThinkingCounter(ThinkingBudget(3, opened=True), START, END)
    assert _run(opened, [9, 9, 9, 9, 9, 7, 7]) == [9, 9, 9, 3, 4, 7, 7]
    assert opened.state == "after" and opened.num_thinking == 3
    unopened = ThinkingCounter(ThinkingBudget(2), START, END)
    assert _run(unopened, [5, 1, 2, 9, 9, 9, 9, 7]) == [5, 1, 2, 9, 9, 3, 4, 7]  # whitespace, then <think>
    zero = ThinkingCounter(ThinkingBudget(0, opened=True), START, END)
    assert _run(zero, [9, 9, 9]) == [3, 4, 9]


def test_a_budget_continues_an_end_marker_begun_and_leaves_a_closed_block_alone():
    begun = ThinkingCounter(ThinkingBudget(2, opened=True), START, END)
    assert _run(begun, [9, 3, 9, 9]) == [9, 3, 4, 9]  # the model wrote `3` (half the marker): `4` follows
    closed = ThinkingCounter(ThinkingBudget(5, opened=True), START, END)
    assert _run(closed, [9, 3, 4, 9, 9, 9, 9, 9, 9]) == [9, 3, 4, 9, 9, 9, 9, 9, 9]
    late = ThinkingCounter(ThinkingBudget(1), START, END)
    model = [9, 9, 9, 9, 9, 9, 1, 2, 9, 9, 9]  # a start marker after the first tokens is not a block
    assert _run(late, model) == model


def _seq(priority: int) -> Sequence:
    return Sequence(f"r{priority}", 0, [1], SamplingParams(priority=priority), frozenset())


def test_waiting_requests_are_ordered_by_priority_then_arrival():
    scheduler = Scheduler(EngineConfig(), cache=None)  # type: ignore[arg-type]  (add() needs no cache)
    for p in (0, 5, -1, 0, 5, -3):
        scheduler.add(_seq(p))
    assert [s.params.priority for s in scheduler.waiting] == [-3, -1, 0, 0, 5, 5]


def test_a_cache_salt_is_a_namespace_of_its_own():
    tokens = list(range(32))
    plain, a, a2, b = [], [], [], []
    extend_hashes(plain, tokens, 16)
    extend_hashes(a, tokens, 16, hash_root("tenant-a"))
    extend_hashes(a2, tokens, 16, hash_root("tenant-a"))
    extend_hashes(b, tokens, 16, hash_root("tenant-b"))
    assert hash_root(None) == ROOT and a == a2
    assert len({plain[0], a[0], b[0]}) == 3 and len({plain[1], a[1], b[1]}) == 3


def test_a_temperature_or_top_p_that_rounds_to_zero_still_samples():
    """Found by benchmarks/fuzz.py: temperature 1e-320 (> 0 as a double, 0 in float32) reached the C draw,
    which refuses a zero temperature (a 500). Below 1e-5 it is greedy (vLLM's rule); a top_p that small
    keeps the top token alone, as it does."""
    import torch

    from blazr.engine.sampling import SampleRequest, sample

    logits = torch.randn(2, 64)
    rows = [
        SampleRequest(SamplingParams(temperature=1e-320), [1], [], None, frozenset()),
        SampleRequest(SamplingParams(temperature=0.7, top_p=1e-320), [1], [], None, frozenset()),
    ]
    assert rows[0].params.is_greedy
    assert sample(logits, rows).token_ids == logits.argmax(-1).tolist()
