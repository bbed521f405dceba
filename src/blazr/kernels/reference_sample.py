"""Plain-torch references of the token-choice kernels (csrc/sample.c): `argmax_rows_reference` and
`sample_rows_reference`, the same formulas in torch's own ops — what runs on a GPU or without the C
library, and what the kernels are tested against. Shapes: logits [B, V] fp32; per-row parameters [B]."""

from __future__ import annotations

import torch

_FLT_MAX = torch.finfo(torch.float32).max
_EXP_LO = -87.0  # csrc/sample.c: weights of t = (x − max) / T below this are 0


def argmax_rows_reference(logits: torch.Tensor) -> torch.Tensor:
    """The first index of each row's largest value, NaN counting as −inf (an all-NaN row gives 0) → [B]."""
    return logits.nan_to_num(nan=float("-inf")).argmax(dim=-1)


def sample_rows_reference(
    logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """One inverse-CDF draw per row from softmax(logits / T) with min-p: weights e = exp((x − max) / T), 0
    where e < min_p (e = p / p_max) or (x − max) / T < −87; the first token whose running weight exceeds
    u · Σe, or the last kept token if rounding leaves u · Σe at the sum. NaN logits weigh 0, +inf ones
    count as the largest float; a row with nothing above −inf gives 0. → token ids [B] (int64)."""
    x = logits.nan_to_num(nan=float("-inf"), posinf=_FLT_MAX)
    m = x.amax(dim=-1, keepdim=True)
    t = (x - m) * (1.0 / temperature)[:, None]
    e = t.exp()
    e = e.masked_fill((t < _EXP_LO) | t.isnan() | (e < min_p[:, None]), 0.0)
    cdf = e.cumsum(dim=-1)
    target = (u * cdf[:, -1])[:, None]
    token = torch.searchsorted(cdf, target, right=True).squeeze(1)
    V = e.shape[-1]
    last_kept = V - 1 - (e.flip(-1) > 0).to(torch.int8).argmax(dim=-1)
    token = torch.where(token >= V, last_kept, token)
    return torch.where(m.squeeze(1) == float("-inf"), torch.zeros_like(token), token)
