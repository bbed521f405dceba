"""Preallocated cache pools and the per-layer view the model receives, allocated from a `CacheLayout`
(state/layout.py: the tensors each layer's mixers declare), e.g.:

- GQA layers: paged K and V, per layer [num_slots, Hkv, D] (num_slots = num_blocks × block_size), in the
  cache's `kv_dtype` (default: the model dtype; 16-bit pools halve the bytes a decode step reads).
- MLA layers: paged latent, per layer [num_slots, Lkv + R] — the normed c_kv followed by the rotated k_rope.
- Mamba2 layers: one state slot per running sequence, then the prefix cache's snapshot slots: conv
  [S, C, K-1] and SSM [S, H, P, N] (float32).

A layer that reads an earlier layer's cache (`LayerLayout.source`, Gemma 4's KV sharing) is handed that
layer's `LayerCache` itself: no pool of its own.

KV groups (state/layout.py): the paged pools of a group's layers have that group's slot count
(`num_slots[g]`: a sliding group's pool holds its windows only), and its slots are addressed by the group's
own `slot_mapping` / `kv_indices` (`ForwardBatch.for_group`; `ModelCache.group(i)` says layer i's).

A sequence's block table (engine side) turns positions into flat slots; `ModelCache.layer(i)` hands layer i
exactly the tensors it owns, by the names its mixers declared, so model code never indexes by layer.

On the CPU the pools are allocated uninitialised (`torch.empty`): no time spent zero-filling gigabytes, and
pages that no sequence reaches never become resident. That is correct because nothing reads a slot before
it is written: attention reads positions [0, seq_len) of its own sequence (written by its prefill or an
earlier step, or shared from a prefix-cache block an earlier step wrote; the runner points the padding of
`kv_indices` at the sequence's own first slot, never at a foreign or unwritten one), and a state slot is
reset when a sequence starts (`fresh`) or copied whole when it forks or resumes from a snapshot (only
snapshots a successful step wrote are ever found). tests/test_load_memory.py fills every pool with NaN
first and compares outputs. Other devices keep zero-filled pools (the memset is free there, and the CUDA
graph path pads through a reserved block).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from blazr.state.layout import CacheLayout, CacheTensor

# Up to this many (src, dst) pairs a state copy runs as one whole-slot copy per tensor and pair (22 MB of
# granite-4.0-h-350m state: 0.9 ms against 2.1 for the indexed copy, which a speculative step pays before
# every verification); more pairs take one indexed copy per tensor (fewer calls).
_FEW_PAIRS = 4


class LayerCache(SimpleNamespace):
    """The cache tensors of one layer, as attributes named by its mixers' declarations (`CacheTensor.name`:
    `k`, `v` [num_slots, Hkv, D]; `latent` [num_slots, Lkv + R]; `conv` [S, C, K-1], `ssm` [S, H, P, N] …)."""


class ModelCache:
    """All cache pools of one model: `num_slots` token slots (paged; per KV group, or one count for all) and
    `num_state_slots` sequences."""

    def __init__(
        self,
        layout: CacheLayout,
        num_slots: int | tuple[int, ...],
        num_state_slots: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.layout = layout
        if isinstance(num_slots, int):
            num_slots = (num_slots,) * layout.num_groups
        self.group_slots = num_slots  # per KV group
        self.num_slots = num_slots[0]
        self.groups = [layer.group for layer in layout.layers]  # each layer's KV group
        self.kv_dtype = kv_dtype or dtype
        self.num_state_slots = num_state_slots
        self.layers: list[LayerCache] = []
        self.paged: list[torch.Tensor] = []  # every paged pool, [num_slots, …]
        self.state: list[torch.Tensor] = []  # every state pool, [S, …]
        new = torch.empty if torch.device(device).type == "cpu" else torch.zeros  # see the module docstring

        def pools(tensors: tuple[CacheTensor, ...], rows: int) -> dict[str, torch.Tensor]:
            return {
                t.name: new(rows, *t.shape, dtype=t.dtype_for(dtype, kv_dtype), device=device)
                for t in tensors
            }

        for layer in layout.layers:
            if layer.source is not None:  # KV shared across layers: the source layer's tensors
                self.layers.append(self.layers[layer.source])
                continue
            paged = pools(layer.paged, num_slots[layer.group])
            state = pools(layer.state, num_state_slots)
            self.paged += paged.values()
            self.state += state.values()
            self.layers.append(LayerCache(**paged, **state))

    def layer(self, i: int) -> LayerCache:
        return self.layers[i]

    def group(self, i: int) -> int:
        """Layer i's KV group."""
        return self.groups[i]

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        """Copy recurrent state, slot src → slot dst for each pair (a fork, a snapshot saved or restored);
        no dst is also a src."""
        if not pairs:
            return
        if len(pairs) <= _FEW_PAIRS:
            for t in self.state:
                for s, d in pairs:
                    t[d].copy_(t[s])
            return
        device = self.state[0].device
        src = torch.tensor([s for s, _ in pairs], device=device)
        dst = torch.tensor([d for _, d in pairs], device=device)
        for t in self.state:
            t[dst] = t[src]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor, group: int = 0) -> None:
        """Copy token slots of KV group `group`'s pools (copy-on-write of a shared, partially filled
        block)."""
        for layer, g, own in zip(self.layers, self.groups, self.layout.layers, strict=True):
            if g == group and own.source is None:
                for t in own.paged:
                    pool = getattr(layer, t.name)
                    pool[dst] = pool[src]

    @property
    def has_paged(self) -> bool:
        return bool(self.paged)

    @property
    def has_state(self) -> bool:
        return bool(self.state)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.paged + self.state)
