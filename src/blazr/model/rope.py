"""Rotary position embedding: frequency tables for the default, linear, llama3, YaRN, LongRoPE and
proportional rules (Gemma 4: the first pairs turn, the others stay at angle 0), and NoPE's zero angles; the
half-split (NeoX) rotation applied to the first `dim` features of each head.

LongRoPE (Phi-3 / Phi-4) has two sets of per-frequency divisors; which one a model uses is fixed by its
context limit (`longrope_factors`), so every position of every sequence is rotated the same way.

Shapes: x [T, H, D] with D ≥ dim; positions [T] (absolute token positions, long); cos/sin tables
[max_len, dim/2].
"""

from __future__ import annotations

import math

import torch
from torch import nn

from blazr.config import RopeConfig


def longrope_factors(cfg: RopeConfig, max_len: int) -> tuple[float, ...]:
    """LongRoPE's divisors for a model whose context limit is `max_len`: the long ones where the limit
    exceeds `original_max_position`, else the short ones — one set for every position of every sequence.

    llama.cpp (`get_rope_factors`: context per sequence > the original) and vLLM (max_model_len > the
    original) choose the same way. transformers instead switches per forward on the sequence's own length
    (and drops its cache when a generation crosses the original length), so the two agree wherever each
    sequence lies on the limit's side: any sequence under a limit ≤ the original (short factors), sequences
    longer than the original under a longer limit (long factors). Under a longer limit a sequence that is
    still short is rotated with the long factors here, as llama.cpp and vLLM rotate it: one static choice
    keeps cached keys valid as a sequence grows, and prefixes shareable between sequences."""
    return cfg.long_factor if max_len > cfg.original_max_position else cfg.short_factor


def inverse_frequencies(cfg: RopeConfig, max_len: int = 0) -> torch.Tensor:
    """inv_freq [dim/2] in float32, after the scaling rule (LongRoPE's factors chosen for a context limit
    of `max_len` positions)."""
    dim = cfg.dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    if cfg.scaling == "longrope":  # transformers' order: 1 / (factor · θ^(2i/dim))
        factors = torch.tensor(longrope_factors(cfg, max_len), dtype=torch.float32, device="cpu")
        return 1.0 / (factors * cfg.theta**exponents)
    inv_freq = 1.0 / (cfg.theta**exponents)
    if cfg.scaling == "linear":
        return inv_freq / cfg.factor
    if cfg.scaling == "llama3":
        old_len = cfg.original_max_position
        low_wavelen = old_len / cfg.low_freq_factor
        high_wavelen = old_len / cfg.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / cfg.factor, inv_freq)
        smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
        smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    if cfg.scaling == "yarn":
        return _yarn_inverse_frequencies(cfg)
    if cfg.scaling == "none":  # NoPE in a rope's place: every angle 0 (cos 1, sin 0)
        return torch.zeros_like(inv_freq)
    if cfg.scaling == "proportional":  # transformers' order: the turning pairs' θ^(-2i/dim), zeros, / factor
        turning = int(cfg.proportion * dim // 2)
        inv_freq[turning:] = 0.0
        return inv_freq / cfg.factor
    return inv_freq


def _yarn_inverse_frequencies(cfg: RopeConfig) -> torch.Tensor:
    dim, base = cfg.dim, cfg.theta

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(cfg.original_max_position / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.is_truncated:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (cfg.factor * pos_freqs)
    keep = 1 - ramp  # 1 → extrapolate (high frequencies), 0 → interpolate
    return interpolation * (1 - keep) + extrapolation * keep


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables; `forward(x, positions)` returns the rotated copy of x.

    Tables are built on the CPU even when the model is constructed on the meta device (weights are loaded
    afterwards); `model.to(device)` moves them."""

    def __init__(self, cfg: RopeConfig, max_len: int) -> None:
        super().__init__()
        self.dim = cfg.dim
        inv_freq = inverse_frequencies(cfg, max_len)
        angles = torch.outer(
            torch.arange(max_len, dtype=torch.float32, device="cpu"), inv_freq
        )  # [max_len, dim/2]
        self.register_buffer("cos", angles.cos() * cfg.attention_factor, persistent=False)
        self.register_buffer("sin", angles.sin() * cfg.attention_factor, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        cos = self.cos[positions].unsqueeze(-2)  # [T, 1, dim/2]
        sin = self.sin[positions].unsqueeze(-2)
        xf = x[..., : self.dim].float()
        x1, x2 = xf[..., :half], xf[..., half:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        if self.dim == x.shape[-1]:
            return rotated
        return torch.cat((rotated, x[..., self.dim :]), dim=-1)
