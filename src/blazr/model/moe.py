"""Mixture of experts: a `Router` that picks k experts per token, `Experts` that run them grouped by expert,
and an optional always-on shared MLP.

Routing (all in float32, from `MoEConfig`):
- scores = softmax or sigmoid of the router logits;
- choice = scores (+ `correction_bias`, used for selection only: DeepSeek-V3 / NemotronH);
- group-limited (num_groups > 1): keep the `topk_groups` groups with the best group score (the group max,
  DeepSeek-V2; the sum of the group's top two, DeepSeek-V3) and choose only inside them;
- ids = top-k of choice; weights = the un-biased scores of those ids, renormalised over the k when
  `is_renormalized`, times `routed_scaling_factor`.
Mixtral / Granite / oxidizr: softmax, renormalised. DeepSeek-V2: softmax, not renormalised, scaled.
DeepSeek-V3 / NemotronH: sigmoid + bias, top-2-sum groups, renormalised, scaled.

Expert compute (`Experts.forward`): the T·k (token, expert) assignments are sorted by expert id, each expert
that received tokens runs one matmul pair on its contiguous rows, and the outputs are un-sorted and summed
over k in a fixed order (no atomics, so the result does not depend on scheduling). Cost scales with the
experts hit, never with E. `MoE.forward_reference` is the plain per-token loop the tests tie it to.

Weights: `router.weight` [E, D]; `router.correction_bias` [E] (float32; keep it so at load);
`experts.gate_up_proj` [E, 2I, D] (gate rows first, then up) or `experts.up_proj` [E, I, D] (ungated,
NemotronH relu²); `experts.down_proj` [E, D, I]; `shared.*` an `MLP` (blazr.model.mlp).

Shapes: T tokens, D hidden, E experts, k experts per token, I expert width, G groups.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import MLPConfig, MoEConfig
from blazr.errors import UnsupportedError
from blazr.model.mlp import MLP, activate


class Router(nn.Module):
    """Top-k gate: x [T, D] → (weights [T, k] float32, ids [T, k] long)."""

    def __init__(self, cfg: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        assert cfg.num_experts % cfg.num_groups == 0, "experts split evenly into groups"
        assert cfg.top_k <= cfg.topk_groups * cfg.num_experts // cfg.num_groups, "k experts fit the groups"
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden_size))
        if cfg.has_correction_bias:
            self.correction_bias = nn.Parameter(
                torch.zeros(cfg.num_experts, dtype=torch.float32), requires_grad=False
            )
            self.correction_bias.keep_float32 = True  # the loader keeps it in float32 whatever the dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = F.linear(x.float(), self.weight.float())  # [T, E]
        scores = logits.softmax(dim=-1) if cfg.scoring == "softmax" else logits.sigmoid()
        choice = scores + self.correction_bias.float() if cfg.has_correction_bias else scores
        if cfg.num_groups > 1:
            grouped = choice.unflatten(-1, (cfg.num_groups, -1))  # [T, G, E/G]
            if cfg.group_score == "max":
                group_scores = grouped.amax(dim=-1)
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            keep = group_scores.topk(cfg.topk_groups, dim=-1).indices  # [T, topk_groups]
            is_kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            choice = grouped.masked_fill(~is_kept[..., None], float("-inf")).flatten(1)
        ids = choice.topk(cfg.top_k, dim=-1).indices  # [T, k]
        weights = scores.gather(1, ids)
        if cfg.is_renormalized:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if cfg.routed_scaling_factor != 1.0:
            weights = weights * cfg.routed_scaling_factor
        return weights, ids


class Experts(nn.Module):
    """E expert MLPs stored as stacked 3-D weights; `forward` runs only the experts that received tokens."""

    def __init__(self, cfg: MLPConfig, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        if cfg.has_bias:
            raise UnsupportedError("MoE experts with biases are not supported")
        self.cfg = cfg
        E, I = num_experts, cfg.intermediate_size
        if cfg.is_gated:
            self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, hidden_size))
        else:
            self.up_proj = nn.Parameter(torch.empty(E, I, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(E, hidden_size, I))

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        """Expert e on rows h [n, D] → [n, D]."""
        if self.cfg.is_gated:
            gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
            a = activate(gate, self.cfg.activation) * up
        else:
            a = activate(F.linear(h, self.up_proj[e]), self.cfg.activation)
        return F.linear(a, self.down_proj[e])

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, D], weights [T, k] float32, ids [T, k] → Σ_k weight · expert(x) [T, D] (float32)."""
        T, k = ids.shape
        E = self.down_proj.shape[0]
        flat_ids = ids.flatten()  # [T·k], assignment a = t·k + j
        order = flat_ids.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat_ids, minlength=E).tolist()  # one host sync per layer
        xs = x[order // k]  # [T·k, D] token rows in expert order
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                ys[start : start + n] = self.expert(e, xs[start : start + n])
                start += n
        ys = ys[order.argsort()].view(T, k, x.shape[1])  # back to assignment order
        return (ys.float() * weights[..., None]).sum(dim=1)


class MoE(nn.Module):
    """Routed experts (+ shared MLP): x [T, D] → [T, D]."""

    def __init__(self, cfg: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = Router(cfg, hidden_size)
        self.experts = Experts(cfg.expert, cfg.num_experts, hidden_size)
        self.shared = MLP(cfg.shared, hidden_size) if cfg.shared is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(x)
        out = self.experts(x, weights, ids).to(x.dtype)
        return out + self.shared(x) if self.shared is not None else out

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same function as a plain loop over tokens and their k experts (for tests)."""
        weights, ids = self.router(x)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                out[t] += weights[t, j] * self.experts.expert(int(ids[t, j]), x[t : t + 1])[0].float()
        out = out.to(x.dtype)
        return out + self.shared(x) if self.shared is not None else out
