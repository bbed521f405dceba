"""Drive a ModelRunner by hand: chosen chunk schedules for one or many sequences, collecting the logits of
every position. This is how the cache invariants are tested (prefill + N steps == full forward, chunked ==
whole, batched == alone) independently of the scheduler's own choices. Blocks and state slots come from the
engine's CacheManager (`place` / `release`), so hand-driven steps never write into blocks its prefix cache
holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from blazr.engine.cache_manager import CacheManager
from blazr.engine.runner import ModelRunner
from blazr.engine.sampling import SamplingParams
from blazr.engine.scheduler import ScheduledBatch
from blazr.engine.sequence import Sequence
from blazr.state.batch import ForwardBatch

if TYPE_CHECKING:
    from blazr.llm import LLM


@torch.inference_mode()
def full_logits(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Cache-less forward of all prompts in one flat batch → [L_i, V] per prompt."""
    batch = ForwardBatch.prefill([len(p) for p in prompts], runner.device)
    ids = torch.tensor([t for p in prompts for t in p], device=runner.device)
    logits = runner.model.compute_logits(runner.model(ids, batch, None), decode=False)
    return list(logits.split([len(p) for p in prompts]))


def place(cache: CacheManager, seqs: list[Sequence], extra_tokens: int = 0) -> None:
    """Blocks for each sequence's tokens (+ `extra_tokens`) in every KV group (whole tables: nothing dropped
    from a sliding group's) and a state slot (no prefix-cache lookup)."""
    for seq in seqs:
        if cache.pools:
            need = [pool.blocks_needed(seq.num_tokens + extra_tokens, 0) for pool in cache.pools]
            seq.block_tables = [pool.allocate(n) for pool, n in zip(cache.pools, need, strict=True)]
        if cache.slots is not None:
            seq.state_slot = cache.slots.allocate()


def release(cache: CacheManager, seqs: list[Sequence]) -> None:
    for seq in seqs:
        cache.release(seq)


@torch.inference_mode()
def stepwise_logits(llm: LLM, prompts: list[list[int]], chunks: list[list[int]]) -> list[torch.Tensor]:
    """Run each sequence through its own chunk schedule (chunks[i] sums to len(prompts[i])), all sequences
    batched together step by step (1-token chunks go through the decode path); each step's blocks come from
    `CacheManager.grow`, so sliding-window groups drop the blocks their windows left as the scheduler's do.
    Returns [L_i, V] per prompt: row p holds the logits after position p."""
    runner = llm.runner
    seqs = [
        Sequence(f"s{i}", 0, list(p), SamplingParams(prompt_logprobs=0, max_tokens=1), frozenset())
        for i, p in enumerate(prompts)
    ]
    cache = llm.engine.cache
    for seq in seqs:  # a state slot; blocks come step by step
        seq.block_tables = [[] for _ in cache.pools] or [[]]
        if cache.slots is not None:
            seq.state_slot = cache.slots.allocate()
    rows: list[list[torch.Tensor]] = [[] for _ in seqs]
    plans = [list(c) for c in chunks]
    try:
        while any(plans):
            active = [i for i, plan in enumerate(plans) if plan]
            decodes = [i for i in active if plans[i][0] == 1 and seqs[i].num_computed_tokens > 0]
            prefills = [i for i in active if i not in decodes]
            order = decodes + prefills
            for i in order:
                assert cache.grow(seqs[i], plans[i][0]), "no blocks for a hand-driven step"
            sched = ScheduledBatch([seqs[i] for i in order], [plans[i][0] for i in order], len(decodes))
            step = runner.run(sched)
            sampled = {s.seq_id: r for r, s in enumerate(step.sample_seqs)}
            for i in order:
                seq, n = seqs[i], plans[i].pop(0)
                if seq.seq_id in step.prompt:
                    rows[i].append(step.prompt[seq.seq_id][1].clone())
                if seq.seq_id in sampled:
                    rows[i].append(step.sample[sampled[seq.seq_id]][None].clone())
                seq.num_computed_tokens += n
    finally:
        release(cache, seqs)
    return [torch.cat(r) for r in rows]


def chunked(n: int, size: int) -> list[int]:
    return [min(size, n - s) for s in range(0, n, size)]


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    """max |Δ| ≤ rel × the reference's logit scale (its standard deviation, at least 1)."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    scale = max(float(ref.float().std()), 1.0)
    err = float((ours.float() - ref.float()).abs().max())
    assert err <= rel * scale, f"max abs logit error {err:.3g} > {rel:g} × scale {scale:.3g}"


def assert_quantized_logits(got: torch.Tensor, want: torch.Tensor, rel: float) -> float:
    """A quantized model's logits `got` [L, V] against its float model's `want`: max |Δ| ≤ rel × the largest
    float logit, and a different top-1 only where the float values are within twice that error of a tie.
    Returns the max |Δ|."""
    error = (got - want).abs().max().item()
    assert error <= rel * want.abs().max().item()
    rows = torch.arange(len(want))
    margin = want[rows, want.argmax(-1)] - want[rows, got.argmax(-1)]
    assert margin.max().item() <= 2 * error
    return error


def assert_greedy_diverges_only_at_ties(ours: LLM, plain: LLM, prompt: list[int], tokens: int = 8) -> None:
    """`tokens` greedy tokens of `ours` and of its float model `plain`: equal, or the first difference where
    the float model's own logits are within 5 % of their largest of a tie."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    a, b = (llm.generate([prompt], params)[0].outputs[0].token_ids for llm in (ours, plain))
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    if same < len(a):  # a divergence only where the float model itself is at a near-tie
        logits = full_logits(plain.runner, [prompt + b[:same]])[0][-1]
        assert logits[b[same]] - logits[a[same]] <= 0.05 * logits.abs().max()
