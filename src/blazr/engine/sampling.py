"""Sampling parameters and the batched sampler.

`SamplingParams` is the public, validated description of how one request samples. `sample()` turns a
batch of logit rows into token ids, row by row parameters vectorised where it matters:

    raw logprobs (returned to the user) ← log_softmax(logits)
    constrained rows (a grammar matcher) → -inf outside the tokens their grammar allows (engine/grammar.py)
    logits ← + logit_bias; repetition / presence / frequency penalties; min_tokens masks stop ids
    greedy rows (temperature 0) → argmax (`ops.argmax_rows`)
    other rows → / temperature → min-p → top-k → top-p → draw (per-request torch.Generator when seeded)
                 (no sort of the vocabulary unless a row's top-p needs it; one uniform per row; rows
                 without top-k / top-p in one fused pass, `ops.sample_rows`)

Shapes: B rows, V vocabulary, K candidates kept after top-k.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from blazr.engine.grammar import GrammarMatcher, StructuredOutput, apply_token_bitmask, fill_bitmasks
from blazr.errors import BlazrError
from blazr.kernels import ops


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
    grammar: GrammarMatcher | None = None  # constrained: only the tokens it allows


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
    """Temperature, then min-p, top-k and top-p (vLLM's order: top-p sees the distribution the other two
    left). logits [B, V] → (probs [B, K], zero outside the kept set and not normalised; token ids [B, K]).

    No full sort of the vocabulary (4 ms a row at V = 49k on a CPU, as long as a decode step): rows without
    top-k / top-p keep K = V in vocabulary order; otherwise the K largest, descending, K just large enough
    for every row's top-k and its top-p mass (from 256, grown ×4 until the nucleus fits, V at most)."""
    device = logits.device
    B, V = logits.shape
    temps = torch.tensor([r.params.temperature for r in rows], device=device, dtype=logits.dtype)
    probs = (logits / temps[:, None]).softmax(dim=-1)  # [B, V]
    min_p = torch.tensor([r.params.min_p for r in rows], device=device, dtype=probs.dtype)
    if bool((min_p > 0).any()):  # p_i >= min_p · p_max
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    ks = _num_candidates(rows, V)
    top_p = [r.params.top_p for r in rows]
    if all(k == V for k in ks) and all(p == 1.0 for p in top_p):
        return probs, torch.arange(V, device=device).expand(B, V)
    k_t = torch.tensor(ks, device=device)
    p_t = torch.tensor(top_p, device=device, dtype=probs.dtype)
    nucleus = [b for b in range(B) if top_p[b] < 1.0 and ks[b] == V]  # top-p over the whole vocabulary
    K = min(V, max([k for k in ks if k < V] + ([NUCLEUS_START] if nucleus else [])))
    mass = probs.sum(dim=-1)  # what min-p kept
    while True:
        values, indices = probs.topk(K, dim=-1)  # sorted descending
        values = values.masked_fill(torch.arange(K, device=device)[None, :] >= k_t[:, None], 0.0)
        kept = torch.where(k_t < V, values.sum(dim=-1), mass)  # the mass top-k left ([B])
        cum = values.cumsum(dim=-1)
        if K == V or not nucleus or bool((cum[nucleus, -1] >= p_t[nucleus] * kept[nucleus]).all()):
            break
        K = min(V, K * 4)
    drop = (cum - values) >= p_t[:, None] * kept[:, None]  # keep the smallest prefix reaching top_p
    drop &= (p_t < 1.0)[:, None]  # (top_p = 1 drops nothing, whatever cumsum's rounding)
    return values.masked_fill(drop, 0.0), indices


NUCLEUS_START = 256  # candidates first tried for top-p without top-k


def _num_candidates(rows: Seq[SampleRequest], V: int) -> list[int]:
    """Tokens each row keeps after top-k (its own k, or the whole vocabulary)."""
    return [r.params.top_k if 0 < r.params.top_k < V else V for r in rows]


def _needs_ranks(r: SampleRequest, V: int) -> bool:
    return 0 < r.params.top_k < V or r.params.top_p < 1.0


def _filter_and_draw(logits: torch.Tensor, rows: Seq[SampleRequest]) -> torch.Tensor:
    """A draw from `filtered_distribution` for every (non-greedy) row. logits [B, V] → token ids [B].

    Inverse CDF: one uniform u per row, the token where the cumulative kept mass first exceeds u × total. A
    seeded row draws its one u from its own generator, so its tokens do not depend on what else shares the
    batch. Rows with and without top-k / top-p are drawn apart, so plain rows never pay for ranking: they
    (temperature and min-p only) take `ops.sample_rows`, one fused pass per row (the C kernel on a CPU)."""
    B, V = logits.shape
    device = logits.device
    tokens = torch.empty(B, dtype=torch.long, device=device)
    ranked = [b for b, r in enumerate(rows) if _needs_ranks(r, V)]
    plain = [b for b, r in enumerate(rows) if not _needs_ranks(r, V)]
    for group in (plain, ranked):
        if not group:
            continue
        sub = logits if len(group) == B else logits[group]
        u = torch.rand(len(group), dtype=torch.float32)
        for i, b in enumerate(group):
            if rows[b].generator is not None:
                u[i] = torch.rand((), generator=rows[b].generator, dtype=torch.float32)
        if group is plain:
            temps = torch.tensor([rows[b].params.temperature for b in group], dtype=torch.float32)
            min_p = torch.tensor([rows[b].params.min_p for b in group], dtype=torch.float32)
            tokens[group] = ops.sample_rows(sub, temps.to(device), min_p.to(device), u.to(device))
            continue
        probs, ids = filtered_distribution(sub, [rows[b] for b in group])
        cdf = probs.cumsum(dim=-1)  # [n, K]
        target = (u.to(device, probs.dtype) * cdf[:, -1])[:, None]
        pos = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
        tokens[group] = ids.gather(1, pos).squeeze(1)
    return tokens


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
    else:
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        if greedy:
            tokens[greedy] = ops.argmax_rows(logits[greedy])
        tokens[rest] = _filter_and_draw(logits[rest], [rows[b] for b in rest])
    result = SampleResult(tokens.tolist(), None, None, None)
    if raw_logprobs is not None:
        result.logprobs = raw_logprobs.gather(1, tokens[:, None]).squeeze(1)
        k = max(want)
        if k > 0:
            result.top_logprobs, result.top_ids = raw_logprobs.topk(k, dim=-1)
    return result
