"""Sampling parameters and the batched sampler.

`SamplingParams` is the public, validated description of how one request samples. `sample()` turns a
batch of logit rows into token ids, row by row parameters vectorised where it matters:

    raw logprobs (returned to the user) ← log_softmax(logits)
    constrained rows (a grammar matcher) → -inf outside the tokens their grammar allows (engine/grammar.py)
    logits ← + logit_bias; repetition / presence / frequency penalties; min_tokens masks stop ids
    greedy rows (temperature 0) → argmax (`ops.argmax_rows`)
    other rows → / temperature → min-p → top-k → top-p → draw (`ops.sample_rows`: one uniform per row,
                 from the request's torch.Generator when seeded; on a CPU one C pass per row, sorting
                 only its top-k / top-p candidates)

Shapes: B rows, V vocabulary, K candidates kept after top-k.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from blazr.engine.grammar import GrammarMatcher, StructuredOutput, apply_token_bitmask, fill_bitmasks
from blazr.engine.pooling import Pooling
from blazr.engine.thinking import ThinkingBudget
from blazr.errors import BlazrError
from blazr.kernels import ops

GREEDY_BELOW = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
MIN_TOP_P = 1e-6  # top_p below this keeps the top token alone, as it does: raised to it (float32 > 0)


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
    structured: StructuredOutput | None = None  # what the output must match (JSON schema, regex, …)
    thinking: ThinkingBudget | None = None  # the reasoning block's token budget (engine/thinking.py)
    priority: int = 0  # waiting order: lower first, arrival order among equals (vLLM's)
    cache_salt: str | None = None  # prefix-cache namespace: only requests with the same salt share blocks
    pooling: Pooling | None = None  # an embedding: the prompt's hidden states pooled, nothing sampled

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
            (
                self.structured is None or isinstance(self.structured, StructuredOutput),
                "structured must be a StructuredOutput",
                self.structured,
            ),
        ]
        for ok, message, value in checks:
            if not ok:
                raise BlazrError(f"{message}, got {value!r}")
        if self.top_k == -1:
            self.top_k = 0
        self.top_p = max(self.top_p, MIN_TOP_P)  # (the same draw: below it, top-p keeps the top token alone)

    @property
    def is_greedy(self) -> bool:
        """Temperature 0, or below `GREEDY_BELOW` (as vLLM: the draw would be the argmax anyway, and a
        temperature that rounds to 0 in float32 cannot divide the logits)."""
        return self.temperature < GREEDY_BELOW

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
    grammar: GrammarMatcher | None = None  # constrained: only the tokens it allows
    forced: int | None = None  # the token this row must take (a thinking budget's end marker)


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
        if len(r.output_ids) < p.min_tokens and r.stop_ids and r.grammar is None:  # (a grammar masks its own)
            logits[b, torch.tensor(sorted(r.stop_ids), device=logits.device)] = float("-inf")
    return logits


def filtered_distribution(
    logits: torch.Tensor, rows: Seq[SampleRequest]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution each row draws from: `ops.filtered_distribution` with the rows' parameters
    (probs [B, K], zero outside the kept set and not normalised; token ids [B, K])."""
    return ops.filtered_distribution(logits, *_row_params(rows, logits.device))


def _row_params(rows: Seq[SampleRequest], device: torch.device) -> tuple[torch.Tensor, ...]:
    """temperature, min_p, top_k, top_p of the rows as tensors [B] on `device`."""
    temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32)
    min_p = torch.tensor([r.params.min_p for r in rows], dtype=torch.float32)
    top_k = torch.tensor([r.params.top_k for r in rows], dtype=torch.int64)
    top_p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32)
    return tuple(t.to(device) for t in (temps, min_p, top_k, top_p))


def _filter_and_draw(logits: torch.Tensor, rows: Seq[SampleRequest]) -> torch.Tensor:
    """A draw from `filtered_distribution` for every (non-greedy) row (`ops.sample_rows`: the C kernel on a
    CPU, one fused pass per row plus a sort of its top-k / top-p candidates). logits [B, V] → token ids [B].

    Inverse CDF: one uniform u per row, the token where the cumulative kept mass first exceeds u × total. A
    seeded row draws its one u from its own generator, so its tokens do not depend on what else shares the
    batch."""
    u = torch.rand(len(rows), dtype=torch.float32)
    for i, r in enumerate(rows):
        if r.generator is not None:
            u[i] = torch.rand((), generator=r.generator, dtype=torch.float32)
    return ops.sample_rows(logits, *_row_params(rows, logits.device), u.to(logits.device))


def sample(logits: torch.Tensor, rows: Seq[SampleRequest]) -> SampleResult:
    """logits [B, V] float32 (left untouched) → one token per row, plus raw logprobs when asked.

    Constrained rows are masked first (as vLLM: penalties and filters see only what the grammar allows); their
    masks are filled on the CPU before any op on the logits, so on a GPU that work overlaps the forward still
    running (nothing has synchronised since it was launched). Free rows cost nothing."""
    constrained = [b for b, r in enumerate(rows) if r.grammar is not None]
    bitmask = None
    if constrained:
        allow_end = [len(rows[b].output_ids) >= rows[b].params.min_tokens for b in constrained]
        matchers = [(rows[b].grammar, end) for b, end in zip(constrained, allow_end, strict=True)]
        bitmask = fill_bitmasks(matchers, logits.shape[-1])  # type: ignore[arg-type]
    want = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want else None
    if bitmask is not None:
        logits = logits.clone()
        apply_token_bitmask(logits, bitmask, constrained)
    if any(r.params.logit_bias or r.params.has_penalties or r.params.min_tokens for r in rows):
        logits = apply_penalties(logits if bitmask is not None else logits.clone(), rows)
    greedy = [b for b, r in enumerate(rows) if r.params.is_greedy]
    rest = [b for b, r in enumerate(rows) if not r.params.is_greedy]
    if not rest:  # all greedy (the common case): no gathers
        tokens = ops.argmax_rows(logits)
    elif not greedy:  # all drawn: no gathers either
        tokens = _filter_and_draw(logits, rows)
    else:
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        tokens[greedy] = ops.argmax_rows(logits[greedy])
        tokens[rest] = _filter_and_draw(logits[rest], [rows[b] for b in rest])
    result = SampleResult(tokens.tolist(), None, None, None)
    for b, r in enumerate(rows):
        if r.forced is not None:
            result.token_ids[b] = r.forced
            tokens[b] = r.forced
    if raw_logprobs is not None:
        result.logprobs = raw_logprobs.gather(1, tokens[:, None]).squeeze(1)
        k = max(want)
        if k > 0:
            result.top_logprobs, result.top_ids = raw_logprobs.topk(k, dim=-1)
    return result
