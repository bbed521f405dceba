"""What a model's cache holds, as data: per layer, the named tensors its mixers declare (each mixer kind's
spec, model/mixers.py), split by how a sequence's prefix lives in them (`Snapshot`), and the bytes they cost.

- `Snapshot.BLOCKS` (attention K / V, the MLA latent): paged rows, one per token slot. A prefix is its
  blocks (shared by hash, engine/cache_manager.py); nothing is copied to keep or restore it, and rolling a
  sequence back is cutting its block table.
- `Snapshot.STATE_SLOT` (Mamba2 conv + SSM state): one row per state slot, holding a running sequence's
  state after its last token. A prefix exists only where it was saved: a snapshot is a copy of the slot's
  rows into a snapshot slot at a block boundary (those inside a step written by the mixer itself, at
  `ForwardBatch.state_saves`), restored by copying it back (`ModelCache.copy_state_slots`).

- A layer whose mixer reads an earlier layer's cache (Gemma 4's KV sharing: `MixerConfig.cache_source`)
  declares no tensors of its own: its `LayerLayout.source` names that layer, whose pools it is handed, so
  it costs no bytes per token and its prefix lives in the source's blocks.

Paged layers fall into KV groups by the window their tensors are read through (`CacheTensor.window`: a
sliding-window attention layer's queries read only the last `window` positions; None: every position).
Layers of one group share a block table per sequence and a pool of blocks (vLLM's hybrid KV-cache
allocator: one block pool per layer-group kind); a sliding group's table holds only the blocks its window
still reaches (engine/cache_manager.py), so its pool is sized for the windows of the running sequences,
not their lengths (state/budget.py). `CacheLayout.windows` lists the groups: the full group first (when
any layer has one), then the sliding windows ascending; `LayerLayout.group` indexes it.

As llama.cpp sizes its recurrent memory from per-architecture numbers and builds a hybrid's as the
composition of its parts, a layer's layout is the concatenation of its mixers' declarations, and the pools
(state/kv_cache.py) and their budget (state/budget.py) are sized from it alone.

Shapes: a `CacheTensor.shape` is one row's; a pool is [num_slots, *shape] (paged) or [S, *shape] (state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import torch


class Snapshot(Enum):
    """How a mixer kind's cache holds a sequence's prefix (prefix caching; later, speculative rollback)."""

    BLOCKS = "blocks"  # paged rows: shared and rolled back through block tables, never copied
    STATE_SLOT = "state slot"  # per-sequence rows: saved and restored by copying a state slot's rows


@dataclass(frozen=True)
class CacheTensor:
    """One named cache tensor of a layer: one row's `shape`, and its element type — a fixed dtype, or the
    model's ("model") or the KV pools' ("kv", `--kv-cache-dtype`; default the model's); for a paged tensor,
    the `window` of positions a query reads back (a sliding window: each query at position p reads positions
    > p − window only; None: all)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | Literal["model", "kv"]
    window: int | None = None

    def dtype_for(self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> torch.dtype:
        if self.dtype == "model":
            return dtype
        if self.dtype == "kv":
            return kv_dtype or dtype
        return self.dtype

    def row_bytes(self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype_for(dtype, kv_dtype)).element_size()


@dataclass(frozen=True)
class LayerLayout:
    """One layer's cache tensors: `paged` (Snapshot.BLOCKS kinds) and `state` (Snapshot.STATE_SLOT kinds) —
    or none, and the index of the earlier layer whose tensors it reads (`source`: KV shared across layers);
    `group`: its paged tensors' KV group (`CacheLayout.windows[group]`; a source's for a reading layer)."""

    paged: tuple[CacheTensor, ...] = ()
    state: tuple[CacheTensor, ...] = ()
    source: int | None = None
    group: int = 0


@dataclass(frozen=True)
class CacheLayout:
    """The cache of a whole model, layer by layer."""

    layers: tuple[LayerLayout, ...]
    windows: tuple[int | None, ...] = (None,)  # each KV group's window (None: full attention)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def has_paged(self) -> bool:
        return any(layer.paged for layer in self.layers)

    @property
    def has_state(self) -> bool:
        return any(layer.state for layer in self.layers)

    def bytes_per_token(self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> int:
        """Paged cache bytes one token costs across all layers (every group holding it)."""
        return sum(t.row_bytes(dtype, kv_dtype) for layer in self.layers for t in layer.paged)

    def group_bytes_per_token(
        self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None
    ) -> tuple[int, ...]:
        """Paged cache bytes one token slot costs in each KV group's pool (all that group's layers)."""
        out = [0] * self.num_groups
        for layer in self.layers:
            out[layer.group] += sum(t.row_bytes(dtype, kv_dtype) for t in layer.paged)
        return tuple(out)

    def group_num_layers(self) -> tuple[int, ...]:
        """Layers with a pool of their own in each KV group (KV-sharing readers not counted)."""
        out = [0] * self.num_groups
        for layer in self.layers:
            out[layer.group] += bool(layer.paged)
        return tuple(out)

    def state_bytes_per_sequence(self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> int:
        """Recurrent-state bytes one sequence (or one snapshot) costs across all layers."""
        return sum(t.row_bytes(dtype, kv_dtype) for layer in self.layers for t in layer.state)


def group_windows(windows: list[int | None]) -> tuple[int | None, ...]:
    """The KV groups of paged layers with these windows: full first (if any), then the windows ascending;
    (None,) when there are none (one group, unused)."""
    distinct = set(windows)
    ordered = ([None] if None in distinct else []) + sorted(w for w in distinct if w is not None)
    return tuple(ordered) or (None,)
