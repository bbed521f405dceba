"""Normalisation layers: RMSNorm, LayerNorm with bias, and the gated RMSNorm of Mamba2.

Statistics are computed in float32 and cast back before the weight is applied, as HF's Llama/Mamba2 norms
do, so half-precision models match transformers bit for bit in their rounding order. A float32 RMSNorm on
the CPU runs the C kernel `ops.rms_norm` (the same formula; ~4x cheaper per decode call than the torch ops).
Shapes: x [..., D]; gate [..., D]; weight/bias [D].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from blazr.config import NormConfig
from blazr.kernels import ops

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class RMSNorm(nn.Module):
    """`weight_offset` (NormConfig): the checkpoint stores w of the scale `offset + w`; the loader adds the
    offset to the stored weight (loading/weights.py reads it from the parameter), so `weight` is the scale."""

    def __init__(self, dim: int, eps: float = 1e-5, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        if weight_offset:
            self.weight.weight_offset = weight_offset
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype is torch.float32 and self.weight.dtype is torch.float32 and x.is_cpu:
            return ops.rms_norm(x, self.weight, self.eps)  # the C kernel (its reference: the lines below)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with bias, statistics in float32 (oxidizr's Mamba2 block norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return y * self.weight + self.bias


def make_norm(cfg: NormConfig, dim: int) -> nn.Module:
    if cfg.kind == "rms":
        return RMSNorm(dim, cfg.eps, cfg.weight_offset)
    if cfg.weight_offset:
        raise ValueError("a LayerNorm with a weight offset is not supported")
    return LayerNorm(dim, cfg.eps)


class GatedRMSNorm(nn.Module):
    """Mamba2's output norm: RMSNorm(y * silu(z)) (or RMSNorm(y) * silu(z) when `is_norm_before_gate`),
    normalised in groups of `group_size` features (the whole width when group_size == dim). `tp`: this
    rank holds a slice of a norm spanning all ranks' widths — the sum of squares is all-reduced."""

    def __init__(
        self,
        dim: int,
        group_size: int,
        eps: float,
        is_norm_before_gate: bool = False,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size = group_size
        self.eps = eps
        self.is_norm_before_gate = is_norm_before_gate
        self.tp = tp

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z [..., D] → [..., D]: the C kernel for float32 CPU rows, else its torch reference."""
        if self.tp is not None:
            return self._across_ranks(y, z, self.tp)
        return ops.gated_rms_norm(y, z, self.weight, self.group_size, self.eps, self.is_norm_before_gate)

    def _across_ranks(self, y: torch.Tensor, z: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        """The reference's math with the mean of squares over every rank's features."""
        dtype, yf = y.dtype, y.float()
        gate = F.silu(z.float())
        if not self.is_norm_before_gate:
            yf = yf * gate
        (yf,) = normed_across_ranks([yf], [self.eps], tp)
        if self.is_norm_before_gate:
            yf = yf * gate
        return self.weight * yf.to(dtype)


def normed_across_ranks(xs: list[torch.Tensor], eps: list[float], tp: TPGroup) -> list[torch.Tensor]:
    """Each x [T, n] (float32: this rank's n of a row's n · world features) divided by its row's root mean
    square over every rank's features (+ its eps), the rows' sums of squares added in one all-reduce for all
    of `xs` (a shard's norms that span the ranks: GatedRMSNorm, attention's q/k norm over all heads)."""
    ss = tp.all_reduce(torch.cat([x.pow(2).sum(-1, keepdim=True) for x in xs], dim=1))
    return [
        x * torch.rsqrt(ss[:, j : j + 1] / (x.shape[-1] * tp.world) + e)
        for j, (x, e) in enumerate(zip(xs, eps, strict=True))
    ]
