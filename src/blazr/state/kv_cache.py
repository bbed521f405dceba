"""Preallocated cache pools and the per-layer view the model receives.

- GQA layers: paged K and V, per layer [num_slots, Hkv, D] (num_slots = num_blocks × block_size), in the
  cache's `kv_dtype` (default: the model dtype; 16-bit pools halve the bytes a decode step reads).
- MLA layers: paged latent, per layer [num_slots, Lkv + R] — the normed c_kv followed by the rotated k_rope.
- Mamba2 layers: one state slot per running sequence, then the prefix cache's snapshot slots: conv
  [S, C, K-1] and SSM [S, H, P, N] (float32).

A sequence's block table (engine side) turns positions into flat slots; `ModelCache.layer(i)` hands layer i
exactly the tensors it owns, so model code never indexes by layer.

On the CPU the pools are allocated uninitialised (`torch.empty`): no time spent zero-filling gigabytes, and
pages that no sequence reaches never become resident. That is correct because nothing reads a slot before
it is written: attention reads positions [0, seq_len) of its own sequence (written by its prefill or an
earlier step, or shared from a prefix-cache block an earlier step wrote; the runner points the padding of
`kv_indices` at the sequence's own first slot, never at a foreign or unwritten one), and a Mamba2 slot is
reset when a sequence starts (`fresh`) or copied whole when it forks or resumes from a snapshot (only
snapshots a successful step wrote are ever found). tests/test_load_memory.py fills every pool with NaN
first and compares outputs. Other devices keep zero-filled pools (the memset is free there, and the CUDA
graph path pads through a reserved block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blazr.config import ModelConfig

SSM_STATE_DTYPE = torch.float32


@dataclass
class LayerCache:
    """The cache tensors of one layer; a field is None when the layer has no mixer of that kind."""

    k: torch.Tensor | None = None  # [num_slots, Hkv, D]
    v: torch.Tensor | None = None  # [num_slots, Hkv, Dv]
    latent: torch.Tensor | None = None  # [num_slots, Lkv + R]
    conv: torch.Tensor | None = None  # [S, C, K-1]
    ssm: torch.Tensor | None = None  # [S, H, P, N] float32

    def copy_state(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy this layer's recurrent state from slots `src` [n] to slots `dst` [n] (long)."""
        assert self.conv is not None and self.ssm is not None
        self.conv[dst] = self.conv[src]
        self.ssm[dst] = self.ssm[src]


class ModelCache:
    """All cache pools of one model: `num_slots` token slots (paged) and `num_state_slots` sequences."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        num_state_slots: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.num_slots = num_slots
        self.kv_dtype = kv_dtype or dtype
        self.num_state_slots = num_state_slots
        self.layers: list[LayerCache] = []
        new = torch.empty if torch.device(device).type == "cpu" else torch.zeros  # see the module docstring
        for layer in cfg.layers:
            lc = LayerCache()
            if (a := layer.attention) is not None:
                lc.k = new(num_slots, a.num_kv_heads, a.head_dim, dtype=self.kv_dtype, device=device)
                lc.v = new(num_slots, a.num_kv_heads, a.head_dim, dtype=self.kv_dtype, device=device)
            if (m := layer.mla) is not None:
                width = m.kv_lora_rank + m.qk_rope_head_dim
                lc.latent = new(num_slots, width, dtype=dtype, device=device)
            if (s := layer.mamba) is not None:
                lc.conv = new(num_state_slots, s.conv_dim, s.conv_kernel - 1, dtype=dtype, device=device)
                lc.ssm = new(
                    num_state_slots,
                    s.num_heads,
                    s.head_dim,
                    s.state_size,
                    dtype=SSM_STATE_DTYPE,
                    device=device,
                )
            self.layers.append(lc)

    def layer(self, i: int) -> LayerCache:
        return self.layers[i]

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        """Copy recurrent state, slot src → slot dst for each pair (a fork, a snapshot saved or restored);
        no dst is also a src."""
        if not pairs:
            return
        device = next(lc.conv.device for lc in self.layers if lc.conv is not None)
        src = torch.tensor([s for s, _ in pairs], device=device)
        dst = torch.tensor([d for _, d in pairs], device=device)
        for lc in self.layers:
            if lc.conv is not None:
                lc.copy_state(src, dst)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy token slots (copy-on-write of a shared, partially filled block)."""
        for lc in self.layers:
            for t in (lc.k, lc.v, lc.latent):
                if t is not None:
                    t[dst] = t[src]

    @property
    def has_paged(self) -> bool:
        return any(lc.k is not None or lc.latent is not None for lc in self.layers)

    @property
    def has_state(self) -> bool:
        return any(lc.conv is not None for lc in self.layers)

    def nbytes(self) -> int:
        total = 0
        for lc in self.layers:
            for t in (lc.k, lc.v, lc.latent, lc.conv, lc.ssm):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total


def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> int:
    """Paged cache bytes one token costs across all layers (K+V for GQA in `kv_dtype`, default `dtype`;
    latent + rope key for MLA in `dtype`)."""
    size = torch.empty((), dtype=dtype).element_size()
    kv_size = torch.empty((), dtype=kv_dtype or dtype).element_size()
    total = 0
    for layer in cfg.layers:
        if (a := layer.attention) is not None:
            total += 2 * a.num_kv_heads * a.head_dim * kv_size
        if (m := layer.mla) is not None:
            total += (m.kv_lora_rank + m.qk_rope_head_dim) * size
    return total


def state_bytes_per_sequence(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Recurrent-state bytes one sequence costs (conv in model dtype, SSM in float32)."""
    size = torch.empty((), dtype=dtype).element_size()
    state_size = torch.empty((), dtype=SSM_STATE_DTYPE).element_size()
    total = 0
    for layer in cfg.layers:
        if (s := layer.mamba) is not None:
            total += s.conv_dim * (s.conv_kernel - 1) * size
            total += s.num_heads * s.head_dim * s.state_size * state_size
    return total
