"""Sampling parameters and the batched sampler.

`SamplingParams` is the public, validated description of how one request samples. `sample()` turns a
batch of logit rows into token ids, row by row parameters vectorised where it matters:

    raw logprobs (returned to the user) ← log_softmax(logits)
    logits ← + logit_bias; repetition / presence / frequency penalties; min_tokens masks stop ids
    greedy rows (temperature 0) → argmax
    other rows → / temperature → min-p → top-k → top-p → draw (per-request torch.Generator when seeded)

Shapes: B rows, V vocabulary, K candidates kept after top-k.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from blazr.errors import BlazrError


@dataclass
class SamplingParams:
    """How to sample one request. Defaults follow blazr's docs (max_tokens 100, temperature 0.7,
    top_p 0.9, top_k 40); temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""

    max_tokens: int = 100
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: int | None = None  # None: no logprobs; k ≥ 0: the sampled token's plus the top k
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            (self.max_tokens >= 1, "max_tokens must be ≥ 1", self.max_tokens),
            (self.temperature >= 0, "temperature must be ≥ 0", self.temperature),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]", self.top_p),
            (self.top_k >= 0 or self.top_k == -1, "top_k must be ≥ 0 (0 or -1 disables it)", self.top_k),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]", self.min_p),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0", self.repetition_penalty),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]", self.presence_penalty),
            (
                -2 <= self.frequency_penalty <= 2,
                "frequency_penalty must be in [-2, 2]",
                self.frequency_penalty,
            ),
            (self.n >= 1, "n must be ≥ 1", self.n),
            (self.min_tokens >= 0, "min_tokens must be ≥ 0", self.min_tokens),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]", self.logprobs),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs must be in [0, 20]",
                self.prompt_logprobs,
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty", self.stop),
        ]
        for ok, message, value in checks:
            if not ok:
                raise BlazrError(f"{message}, got {value!r}")
        if self.top_k == -1:
            self.top_k = 0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass
class SampleRequest:
    """One row of the batch: its params, token history (for penalties) and generator."""

    params: SamplingParams
    prompt_ids: Seq[int]
    output_ids: Seq[int]
    generator: torch.Generator | None
    stop_ids: frozenset[int]  # masked while len(output_ids) < min_tokens


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: torch.Tensor | None  # [B] logprob of each sampled token (raw model distribution)
    top_ids: torch.Tensor | None  # [B, k] top tokens by raw logprob, k = max requested
    top_logprobs: torch.Tensor | None  # [B, k]


def apply_penalties(logits: torch.Tensor, rows: Seq[SampleRequest]) -> torch.Tensor:
    """In place, in vLLM's order: logit_bias; repetition (over prompt + output tokens: positive logits
    divided, others multiplied); frequency and presence (OpenAI's, over output tokens:
    `- frequency · count - presence · [count > 0]`); stop ids masked while output < min_tokens."""
    V = logits.shape[-1]
    for b, r in enumerate(rows):
        p = r.params
        if p.logit_bias:
            ids = torch.tensor([i for i in p.logit_bias if 0 <= i < V], dtype=torch.long)
            vals = torch.tensor([p.logit_bias[int(i)] for i in ids], dtype=logits.dtype)
            logits[b].index_add_(0, ids.to(logits.device), vals.to(logits.device))
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(r.prompt_ids) | set(r.output_ids)), dtype=torch.long, device=logits.device
            )
            if seen.numel():
                vals = logits[b, seen]
                logits[b, seen] = torch.where(
                    vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
                )
        if (p.presence_penalty or p.frequency_penalty) and r.output_ids:
            out = torch.tensor(list(r.output_ids), dtype=torch.long, device=logits.device)
            counts = torch.bincount(out, minlength=V)[:V].to(logits.dtype)
            logits[b] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        if len(r.output_ids) < p.min_tokens and r.stop_ids:
            logits[b, torch.tensor(sorted(r.stop_ids), device=logits.device)] = float("-inf")
    return logits


def filtered_distribution(
    logits: torch.Tensor, rows: Seq[SampleRequest]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature, then min-p, top-k and top-p (vLLM's order: top-p sees the distribution the other two
    left). logits [B, V] → (probs [B, K] unnormalised after top-p, token ids [B, K]), K candidates."""
    device = logits.device
    temps = torch.tensor([r.params.temperature for r in rows], device=device, dtype=logits.dtype)
    logits = logits / temps[:, None]
    V = logits.shape[-1]
    ks = _num_candidates(rows, V)
    K = max(ks)
    if K < V:
        values, indices = logits.topk(K, dim=-1)  # sorted descending
    else:
        values, indices = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(K, device=device)
    keep = ranks[None, :] < torch.tensor(ks, device=device)[:, None]
    min_p = torch.tensor([r.params.min_p for r in rows], device=device, dtype=values.dtype)
    if bool((min_p > 0).any()):  # p_i >= min_p · p_max  ⇔  logit_i >= logit_max + log(min_p)
        keep &= values >= values[:, :1] + torch.log(min_p)[:, None]
    values = values.masked_fill(~keep, float("-inf"))
    probs = values.softmax(dim=-1)  # [B, K]
    top_p = torch.tensor([r.params.top_p for r in rows], device=device, dtype=probs.dtype)
    if bool((top_p < 1).any()):
        cum = probs.cumsum(dim=-1)
        drop = (cum - probs) >= top_p[:, None]  # keep the smallest prefix whose mass reaches top_p
        probs = probs.masked_fill(drop, 0.0)
    return probs, indices


def _num_candidates(rows: Seq[SampleRequest], V: int) -> list[int]:
    """Tokens each row keeps after top-k (its own k, or the whole vocabulary)."""
    return [r.params.top_k if 0 < r.params.top_k < V else V for r in rows]


def _filter_and_draw(logits: torch.Tensor, rows: Seq[SampleRequest]) -> torch.Tensor:
    """A draw from `filtered_distribution` for every (non-greedy) row. logits [B, V] → token ids [B].

    Exponential race: argmax(p / E) with E ~ Exp(1) is a sample from p (no normalisation needed). A seeded
    row draws exactly as many E as it has candidates, so its random stream — and its tokens — do not
    depend on what else shares the batch."""
    probs, indices = filtered_distribution(logits, rows)
    K = probs.shape[-1]
    device = logits.device
    noise = torch.empty_like(probs)
    shared = [b for b, r in enumerate(rows) if r.generator is None]
    if shared:
        noise[shared] = torch.empty(len(shared), K, device=device, dtype=probs.dtype).exponential_()
    for b, (r, k) in enumerate(zip(rows, _num_candidates(rows, logits.shape[-1]), strict=True)):
        if r.generator is not None:
            e = torch.empty(k, dtype=probs.dtype, device=r.generator.device).exponential_(
                generator=r.generator
            )
            noise[b, :k] = e.to(device)
            noise[b, k:] = 1.0  # beyond its top-k: probability 0 anyway
    choice = (probs / noise).argmax(dim=-1)  # [B]
    return indices.gather(1, choice[:, None]).squeeze(1)


def sample(logits: torch.Tensor, rows: Seq[SampleRequest]) -> SampleResult:
    """logits [B, V] float32 (left untouched) → one token per row, plus raw logprobs when asked."""
    want = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want else None
    if any(r.params.logit_bias or r.params.has_penalties or r.params.min_tokens for r in rows):
        logits = apply_penalties(logits.clone(), rows)
    greedy = [b for b, r in enumerate(rows) if r.params.is_greedy]
    rest = [b for b, r in enumerate(rows) if not r.params.is_greedy]
    if not rest:  # all greedy (the common case): no gathers
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        if greedy:
            tokens[greedy] = logits[greedy].argmax(dim=-1)
        tokens[rest] = _filter_and_draw(logits[rest], [rows[b] for b in rest])
    result = SampleResult(tokens.tolist(), None, None, None)
    if raw_logprobs is not None:
        result.logprobs = raw_logprobs.gather(1, tokens[:, None]).squeeze(1)
        k = max(want)
        if k > 0:
            result.top_logprobs, result.top_ids = raw_logprobs.topk(k, dim=-1)
    return result
