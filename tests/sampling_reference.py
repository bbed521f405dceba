"""Plain, token-by-token references of the sampling formulas vLLM documents — what the sampler is checked
against (test_sampling.py) and what server outputs are checked against (test_server_sampling.py)."""

from __future__ import annotations

import math
from collections import Counter

from blazr.engine.sampling import SamplingParams


def reference_penalties(
    logits: list[float], prompt: list[int], output: list[int], p: SamplingParams, stop_ids: set[int]
) -> list[float]:
    """vLLM's documented formulas, one token at a time."""
    x = list(logits)
    for token, bias in p.logit_bias.items():
        x[token] += bias
    if len(output) < p.min_tokens:
        for token in stop_ids:
            x[token] = -math.inf
    for token in set(prompt) | set(output):
        x[token] = x[token] / p.repetition_penalty if x[token] > 0 else x[token] * p.repetition_penalty
    for token, count in Counter(output).items():
        x[token] -= p.frequency_penalty * count + p.presence_penalty
    return x


def reference_distribution(logits: list[float], p: SamplingParams) -> dict[int, float]:
    """temperature → min-p → top-k → top-p (smallest prefix reaching top_p), renormalised; token → prob."""
    z = [v / p.temperature for v in logits]
    top = max(z)
    probs = {i: math.exp(v - top) for i, v in enumerate(z)}
    total = sum(probs.values())
    probs = {i: q / total for i, q in probs.items()}
    biggest = max(probs.values())
    keep = {i: q for i, q in probs.items() if q >= p.min_p * biggest}
    order = sorted(keep, key=lambda i: -keep[i])
    if p.top_k > 0:
        order = order[: p.top_k]
    mass = sum(keep[i] for i in order)
    kept, cum = {}, 0.0
    for i in order:
        if cum >= p.top_p:
            break
        kept[i] = keep[i] / mass
        cum += keep[i] / mass
    total = sum(kept.values())
    return {i: q / total for i, q in kept.items()}
