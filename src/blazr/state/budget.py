"""How big the cache pools are: the memory budget and the plan that fits the engine's limits into it.

The paged pool wants `max_num_seqs × max_model_len` token slots (every sequence at full length) and the
recurrent-state pool one slot per sequence. The budget caps the two together: `cache_memory_gib` when set
(`--cache-memory`), else `DEFAULT_FRACTION` of the memory the machine can spare once the weights are loaded
(MemAvailable on the CPU, free device memory on CUDA). A budget below the full-length wish leaves fewer
token slots (the scheduler then preempts and recomputes); a budget that cannot hold even one sequence of
`max_model_len` tokens is an error, in one line naming the sizes and the flags that change them.

KV groups (state/layout.py): a sliding-window group's blocks hold only what each sequence's window still
reaches — at most ⌈W / block⌉ + 1 blocks of its computed tokens, and the blocks of the chunk a step adds —
so its pool is sized `max_num_seqs × (⌈W / block⌉ + 2 + ⌈max_num_batched_tokens / block⌉)` blocks (never
more than the full-length wish), taken from the budget first; the full-attention group gets the rest as
above. A model of sliding layers only (Mistral-style) sizes its one group that way. A forced
`num_kv_blocks` caps every group at that count.

With speculative decoding, models with recurrent layers also hold one scratch state slot per sequence: the
state before a step that verifies drafts, to return to when one is rejected (engine/cache_manager.py).

With prefix caching, models with recurrent layers also get a pool of state snapshots
(engine/cache_manager.py): `num_state_snapshots` slots when set, else what is left of the budget after the
paged and running-state pools, up to `SNAPSHOT_FRACTION` of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from blazr.config import EngineConfig
from blazr.errors import BlazrError
from blazr.state.layout import CacheLayout

DEFAULT_FRACTION = 0.5  # of the available memory, when no budget is given
SNAPSHOT_FRACTION = 0.25  # of the budget, at most, for recurrent-state snapshots (prefix caching)
_GiB = 1 << 30


def available_memory(device: torch.device | str = "cpu") -> int:
    """Bytes this process could still take: free device memory on CUDA; on the CPU Linux's MemAvailable
    (free + reclaimable page cache), or the physical memory where /proc/meminfo is missing."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cache_budget(engine: EngineConfig, device: torch.device | str = "cpu") -> int:
    """The cache memory budget in bytes: `engine.cache_memory_gib`, else DEFAULT_FRACTION of what is
    available now."""
    if engine.cache_memory_gib is not None:
        return int(engine.cache_memory_gib * _GiB)
    return int(available_memory(device) * DEFAULT_FRACTION)


def shared_budget(
    engine: EngineConfig, held_bytes: int, num_shares: int, device: torch.device | str | None = None
) -> int:
    """Several models behind one server (server/model_pool.py): the cache budget, in bytes, of the next
    model to load — an equal share, over the `num_shares` models that may still load, of what is left:
    `cache_memory_gib` (then the total across loaded models) less the `held_bytes` their pools hold, else
    DEFAULT_FRACTION of the memory available now (which the loaded models' pools already left).
    `device` None: CUDA when there is one."""
    if engine.cache_memory_gib is not None:
        left = int(engine.cache_memory_gib * _GiB) - held_bytes
    else:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        left = int(available_memory(device) * DEFAULT_FRACTION)
    return max(0, left) // max(1, num_shares)


@dataclass(frozen=True)
class CachePlan:
    """Pool sizes: `group_blocks[g]` paged blocks of `block_size` tokens for KV group g (its window
    `windows[g]`, None: full attention; each pool holds one more block, reserved for the padding rows of
    graph-captured steps), `num_state_slots` recurrent slots for running sequences and `num_snapshots` for
    prefix-cache snapshots (`snapshot_bytes` each), `num_spec_slots` for the states before verifying drafts;
    `bytes` is what they all take, `budget` the budget they were fitted into (bytes), `group_bytes` each KV
    group's share of `bytes`. The state pool's rows: running slots, then snapshots, then the drafts'
    slots."""

    group_blocks: tuple[int, ...]
    block_size: int
    num_state_slots: int
    bytes: int
    budget: int
    is_auto_budget: bool
    num_snapshots: int = 0
    snapshot_bytes: int = 0
    num_spec_slots: int = 0
    windows: tuple[int | None, ...] = (None,)
    group_bytes: tuple[int, ...] = ()

    @property
    def num_blocks(self) -> int:
        """Blocks of the first KV group (the full-attention one, when the model has one)."""
        return self.group_blocks[0]

    @property
    def num_state_rows(self) -> int:
        """Rows of the state pool: running slots, snapshots, drafts' slots."""
        return self.num_state_slots + self.num_snapshots + self.num_spec_slots

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_bytes(self) -> int:
        """Bytes of the paged pools, all groups."""
        return sum(self.group_bytes)

    def describe(self) -> str:
        """One line for the load log: tokens, GiB, and the budget they came from."""
        origin = f"{DEFAULT_FRACTION:g} of available memory" if self.is_auto_budget else "--cache-memory"
        parts = [
            f"{n * self.block_size} {group_name(w)} token slots" if len(self.windows) > 1 or w else
            f"{n * self.block_size} token slots"
            for n, w in zip(self.group_blocks, self.windows, strict=True)
            if n
        ]  # fmt: skip
        parts += [f"{self.num_state_slots} state slots"] if self.num_state_slots else []
        parts += [f"{self.num_snapshots} state snapshots"] if self.num_snapshots else []
        parts += [f"{self.num_spec_slots} draft states"] if self.num_spec_slots else []
        return (
            f"{' + '.join(parts)}, "
            f"{self.bytes / _GiB:.2f} GiB of a {self.budget / _GiB:.2f} GiB budget ({origin})"
        )


def group_name(window: int | None) -> str:
    """A KV group's name in logs and `blazr info`: "full" or "sliding-W"."""
    return "full" if window is None else f"sliding-{window}"


def window_blocks(window: int, engine: EngineConfig) -> int:
    """Blocks a sliding group of this window needs for `max_num_seqs` sequences (module docstring), at most
    the full-length wish."""
    bs = engine.block_size
    per_seq = -(-window // bs) + 2 + -(-engine.max_num_batched_tokens // bs)
    return min(engine.max_num_seqs * per_seq, -(-engine.max_num_seqs * engine.max_model_len // bs))


def plan_cache(
    layout: CacheLayout,
    engine: EngineConfig,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> CachePlan:
    """Fit the pools of `layout` (the model's, model/mixers.py `cache_layout`) into the budget (see the
    module docstring); `engine.num_kv_blocks` forces the block count (a cap, for sliding groups)."""
    assert engine.max_model_len is not None, "EngineConfig.resolved(model limit) comes first"
    per_group = layout.group_bytes_per_token(dtype, kv_dtype)
    per_token = sum(per_group)
    bs = engine.block_size
    per_snapshot = layout.state_bytes_per_sequence(dtype, kv_dtype)
    num_state_slots = engine.max_num_seqs if per_snapshot else 0
    num_spec_slots = num_state_slots if engine.speculative is not None else 0
    state = (num_state_slots + num_spec_slots) * per_snapshot
    budget = cache_budget(engine, device)
    is_auto = engine.cache_memory_gib is None
    blocks = [0] * layout.num_groups
    one = -(-engine.max_model_len // bs)  # blocks of one full-length sequence
    for g, w in enumerate(layout.windows):
        if per_group[g] and w is not None:  # sliding: the windows of the running sequences
            blocks[g] = window_blocks(w, engine)
            if engine.num_kv_blocks:
                blocks[g] = min(blocks[g], engine.num_kv_blocks)
    fixed = sum((n + 1) * bs * per_group[g] for g, n in enumerate(blocks) if n)
    if per_token == 0:
        pass
    elif layout.windows[0] is None:  # the full group takes what the sliding ones leave
        if engine.num_kv_blocks:
            blocks[0] = engine.num_kv_blocks
        else:
            want = -(-engine.max_num_seqs * engine.max_model_len // bs)
            fits = max(0, budget - state - fixed) // (per_group[0] * bs) - 1  # the reserved padding block
            if fits < one:
                need = one * bs * per_group[0] + fixed + state
                raise BlazrError(
                    f"cache memory budget {budget / _GiB:.2f} GiB cannot hold one sequence of "
                    f"--max-model-len {engine.max_model_len} ({need / _GiB:.2f} GiB at {per_token} bytes per "
                    "token"
                    f"{f' + {state / _GiB:.2f} GiB of state' if state else ''}); lower --max-model-len or "
                    "raise --cache-memory"
                )
            blocks[0] = min(want, fits)
    elif fixed + state > budget and not engine.num_kv_blocks:  # sliding groups only: their windows
        raise BlazrError(
            f"cache memory budget {budget / _GiB:.2f} GiB cannot hold the sliding windows of --max-num-seqs "
            f"{engine.max_num_seqs} ({(fixed + state) / _GiB:.2f} GiB); lower --max-num-seqs or raise "
            "--cache-memory"
        )
    if per_token == 0 and not engine.num_kv_blocks and state > budget:
        raise BlazrError(
            f"cache memory budget {budget / _GiB:.2f} GiB cannot hold the recurrent state of --max-num-seqs "
            f"{engine.max_num_seqs} ({state / _GiB:.2f} GiB); lower --max-num-seqs or raise --cache-memory"
        )
    group_bytes = tuple((n + 1) * bs * per_group[g] if per_group[g] else 0 for g, n in enumerate(blocks))
    total = sum(group_bytes) + state
    num_snapshots = 0
    if per_snapshot and engine.enable_prefix_caching:
        room = min(int(budget * SNAPSHOT_FRACTION), budget - total)
        num_snapshots = engine.num_state_snapshots or max(0, room) // per_snapshot
    total += num_snapshots * per_snapshot
    return CachePlan(
        tuple(blocks), bs, num_state_slots, total, budget, is_auto, num_snapshots, per_snapshot,
        num_spec_slots, layout.windows, group_bytes,
    )  # fmt: skip
