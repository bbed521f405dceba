"""SeqOutput: what one sequence produced in one engine step (token and text deltas, logprobs, its final
state when finished), one sequence's outputs of a step merged (a verified draft after the token before it),
and the prompt logprobs a request asked for scored from prefill logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blazr.engine.sequence import Sequence, TokenLogprob


@dataclass
class SeqOutput:
    """What one sequence produced in one step (deltas), plus its final state when `finished`."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None
    first_token_time: float | None = None
    arrival_time: float = 0.0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)
    error: BaseException | None = None  # finish_reason "error": what failed (for the log, not for clients)
    embedding: list[float] | None = None  # a pooling request's vector (engine/pooling.py)


def merge_outputs(first: SeqOutput, then: SeqOutput) -> SeqOutput:
    """One sequence's two outputs of one step (a verified draft after the token before it) as one."""
    first.token_ids = first.token_ids + then.token_ids
    first.text += then.text
    first.logprobs = first.logprobs + then.logprobs
    first.finished, first.finish_reason = then.finished, then.finish_reason
    first.num_output_tokens = then.num_output_tokens
    return first


def score_prompt(seq: Sequence, first: int, logits: torch.Tensor) -> None:
    """Append the logprobs of prompt tokens first … first + m - 1 (logits [m, V] predict them)."""
    if not seq.prompt_logprobs:
        seq.prompt_logprobs = [None]  # the first prompt token has no prediction
    lps = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(seq.prompt_ids[first : first + logits.shape[0]], dtype=torch.long)
    chosen = lps.gather(1, targets[:, None].to(lps.device)).squeeze(1).tolist()
    k = seq.params.prompt_logprobs or 0
    tops = lps.topk(k, dim=-1) if k else None
    for i, (t, v) in enumerate(zip(targets.tolist(), chosen, strict=True)):
        top = list(zip(tops.indices[i].tolist(), tops.values[i].tolist(), strict=True)) if tops else []
        seq.prompt_logprobs.append(TokenLogprob(t, v, top))
