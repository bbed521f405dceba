"""Plain-torch references of the token-choice kernels (csrc/sample.c): `argmax_rows_reference`,
`filtered_distribution` and `sample_rows_reference`, the same formulas in torch's own ops — what runs on a
GPU or without the C library, and what the kernels are tested against. Shapes: logits [B, V] fp32; per-row
parameters [B]; K candidates kept after top-k."""

from __future__ import annotations

import torch

_FLT_MAX = torch.finfo(torch.float32).max
NUCLEUS_START = 256  # candidates first tried for top-p without top-k


def argmax_rows_reference(logits: torch.Tensor) -> torch.Tensor:
    """The first index of each row's largest value, NaN counting as −inf (an all-NaN row gives 0) → [B]."""
    return logits.nan_to_num(nan=float("-inf")).argmax(dim=-1)


def filtered_distribution(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature, then min-p, top-k (0: off) and top-p (vLLM's order: top-p sees the distribution the other
    two left) → (probs [B, K], zero outside the kept set and not normalised; token ids [B, K]). NaN logits
    weigh 0, +inf ones count as the largest float.

    No full sort of the vocabulary (4 ms a row at V = 49k on a CPU, as long as a decode step): rows without
    top-k / top-p keep K = V in vocabulary order; otherwise the K largest, descending, K just large enough
    for every row's top-k and its top-p mass (from 256, grown ×4 until the nucleus fits, V at most)."""
    device = logits.device
    B, V = logits.shape
    x = logits.nan_to_num(nan=float("-inf"), posinf=_FLT_MAX)
    probs = ((x - x.amax(dim=-1, keepdim=True)) / temperature[:, None]).softmax(dim=-1)  # [B, V]
    if bool((min_p > 0).any()):  # p_i >= min_p · p_max
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    ks = [k if 0 < k < V else V for k in top_k.tolist()]
    tps = top_p.tolist()
    if all(k == V for k in ks) and all(p == 1.0 for p in tps):
        return probs, torch.arange(V, device=device).expand(B, V)
    k_t = torch.tensor(ks, device=device)
    p_t = top_p.to(device, probs.dtype)
    nucleus = [b for b in range(B) if tps[b] < 1.0 and ks[b] == V]  # top-p over the whole vocabulary
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


def sample_rows_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """One inverse-CDF draw per row from `filtered_distribution`: the first candidate whose running mass
    exceeds u · (the kept mass), or the last kept one if rounding leaves the target at the sum; a row with
    nothing above −inf gives 0. → token ids [B] (int64)."""
    probs, ids = filtered_distribution(logits, temperature, min_p, top_k, top_p)
    cdf = probs.cumsum(dim=-1)  # [B, K]
    target = (u.to(cdf.device, cdf.dtype) * cdf[:, -1])[:, None]
    pos = torch.searchsorted(cdf, target, right=True).squeeze(1)
    K = probs.shape[-1]
    last_kept = K - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(dim=-1)
    pos = torch.where(pos >= K, last_kept, pos)
    token = ids.gather(1, pos[:, None]).squeeze(1)
    empty = logits.nan_to_num(nan=float("-inf")).amax(dim=-1) == float("-inf")
    return torch.where(empty, torch.zeros_like(token), token)
