"""MixerSpec: what one mixer kind declares, beside its nn.Module, for everything outside the module.

A mixer kind (GQA attention, MLA, Mamba2, …) is its config (config.py), its module, and this spec, which the
registry (model/mixers.py) hands to every consumer instead of their naming kinds:
- `build`: the module of a layer (model/block.py);
- `cache`, `snapshot`: the cache tensors it needs per token or per sequence, and how a sequence's prefix
  lives in them (state/layout.py: the pools, their budget, prefix caching's snapshots);
- `linears`, `float_linears`: its quantizable linears (loading/quantize.py) and those kept float on purpose;
  a linear in neither fails the model's build;
- `fused`: parameters stored fused whose parts a checkpoint may hold apart (loading/names);
- `shard`, `slice`: its tensor-parallel split — the per-rank config, each full tensor's rank piece
  (distributed/shard.py; helpers in distributed/split.py);
- `is_plan_safe`, `graph_windows`: whether the recorded CPU decode plan (engine/decode_plan.py) and a CUDA
  graph (engine/cuda_graphs.py) may hold it — allow-lists: a kind that does not say yes is refused;
- `chains_rows`: its decode step is right for several consecutive tokens of one sequence as rows of one
  batch (attention writes every row's keys before any row attends; a recurrent kind runs the rows that share
  a state slot in row order) — speculative decoding then verifies drafts as decode rows (engine/runner.py).
Every field is required (no defaults): a kind that forgets a declaration fails where it is written, and
`register` checks each one's type.

Names: a kind's parameters are `layers.{i}.{prefix}.{leaf}`; `leaf` names below are relative to the module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from torch import nn

from blazr.config import MixerConfig, RopeConfig
from blazr.model.rope import RotaryEmbedding
from blazr.state.layout import CacheTensor, Snapshot

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

C = TypeVar("C", bound=MixerConfig)

# The rotary table of a rope config, shared by every layer with an equal one (None: no rope).
RopeFor = Callable[[RopeConfig | None], RotaryEmbedding | None]


@dataclass(frozen=True)
class FusedParts:
    """The logical parts of one fused parameter, as a checkpoint may store them apart: (leaf, rows) each,
    joined along dim 0 in order — or, with `num_heads`, head by head (head h: the h-th row block of every
    part in turn; MLA's kv_b_proj, per head [k_nope; v])."""

    parts: tuple[tuple[str, int], ...]
    num_heads: int = 0


@dataclass(frozen=True)
class MixerSpec(Generic[C]):
    """One mixer kind's declarations (see the module docstring); `kind` is its config's."""

    config: type[C]
    prefix: str  # the Block attribute and parameter-name prefix: "attn", "mla", "mamba"
    # (cfg, hidden_size, rope_for, tp) → the module; tp: this layer is one tensor-parallel shard
    build: Callable[[C, int, RopeFor, TPGroup | None], nn.Module]
    cache: Callable[[C], tuple[CacheTensor, ...]]  # one layer's cache tensors (rows per `snapshot`)
    snapshot: Snapshot
    linears: tuple[str, ...]  # quantized under --quantize, on the kernels otherwise
    float_linears: tuple[str, ...]  # left float on purpose (e.g. read whole by another path)
    fused: Callable[[C, str], FusedParts | None]  # (cfg, leaf) → its parts, None: stored whole
    shard: Callable[[C, int, str], C]  # (cfg, world, "layer i's") → the rank's config, sizes divided
    # (full cfg, leaf, full tensor, rank, world) → the rank's piece; None: replicated
    slice: Callable[[C, str, torch.Tensor, int, int], torch.Tensor | None]
    is_plan_safe: bool  # its decode step is kernel ops only: a recorded decode plan may hold it
    chains_rows: bool  # its decode step takes a sequence's consecutive tokens as rows (see above)
    # a CUDA graph may hold it, whose decode masks it reads (the sliding windows); None: refused
    graph_windows: Callable[[C], tuple[int | None, ...]] | None

    @property
    def kind(self) -> str:
        return self.config.kind
