"""CacheManager: the one owner of cache bookkeeping — paged blocks and their reference counts, recurrent-state
slots, prefix hashes and state snapshots. The scheduler holds it and asks for room; the runner only receives
block tables, state slots and the copies a step needs (`CacheOps`).

Prefix caching (on unless `EngineConfig.enable_prefix_caching` is off):

- Attention / MLA. Once a step has computed a full block, the block is named by the hash of its prefix
  (state/prefix.py). Admitting a sequence looks its blocks' hashes up in order and shares the cached ones
  (reference-counted), so only the rest is prefilled. A hit always leaves at least one token to compute (its
  logits give the first sample) and covers full blocks only, so a shared block is never written. Freed
  blocks stay findable until allocation reuses them, least recently freed first.
- Mamba2 (recurrent) layers cannot be cut back to an arbitrary prefix: their state exists only where it was
  saved. A forward step copies a sequence's conv + SSM state into a snapshot slot at chosen block
  boundaries (mid-chunk ones inside the Mamba2 layer, the rest after the step); a hit of a model with
  recurrent layers is the deepest boundary that has a snapshot and, when the model has attention layers too,
  cached blocks up to it. The snapshot is copied into the sequence's own state slot before the step.
  Kept boundaries: every `state_snapshot_interval`-th block, the last boundary before the prompt's end (an
  exact repeat resumes there), and the newest boundary a sequence has reached (one "rolling" snapshot that
  moves on as it decodes — the next turn of a chat resumes there). Snapshots live in their own pool
  (`CachePlan.num_snapshots` slots), evicted least recently used first.

KV groups (state/layout.py: one per sliding window, one for full attention). Each group has its own block
pool (`pools[g]`) and each sequence one block table per group (`Sequence.block_tables`), indexed by block
number. A sliding group's table keeps only the blocks its window still reaches: before a step starting at
position c, blocks entirely before c − W + 1 are dropped (`_trim`: the entry becomes `DROPPED` and the
block loses this sequence's reference — a block a prefix-cache hit or a fork shares stays with its other
users, and a named block stays findable until reused). After a step the table is trimmed for the next one,
keeping one position more — except a sequence that carried drafts: a rejected draft of a recurrent model
makes its step be computed again from its start, so its table is trimmed before its next step (`grow`).
A chunk longer than W still holds all its own blocks during its step. Prefix caching per group: every
group names its full blocks by the same prefix hashes; a hit of d blocks needs the full group's blocks
0..d−1 and, for each sliding group, the blocks the next step reads (`first_needed(d · block)` .. d−1) still
held in that group's pool — the hit is the deepest d where all hold (and, with recurrent layers, a
snapshot).

Speculative decoding: a sequence verifying d drafted tokens computes them in its step, so its blocks grow for
d + 1 tokens, and only the verified ones are named afterwards (`commit` sees the tokens the sequence kept).
A recurrent state cannot be cut back to a position, so with recurrent layers `reserve_drafts` also gives the
sequence a scratch state slot and copies its state there before the step; when the verification rejects a
draft, `settle_drafts` returns the copy that puts that state back, and the step's kept tokens are computed
again with the next one (the engine moves the sequence back to where the step began). Boundaries the drafts
cross get no prefix snapshot (the step does not know which tokens stand); the next one reached does.

Lookups are skipped for sequences that need prompt logprobs they have not produced yet (a hit computes no
logits for the cached positions). Statistics count the first admission of each sequence: `queries` its
prompt tokens, `hits` those found cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blazr.engine.sequence import Sequence
from blazr.state.allocator import DROPPED, BlockAllocator, SlotAllocator, SnapshotPool
from blazr.state.budget import CachePlan
from blazr.state.prefix import BlockHash, extend_hashes, hash_root


@dataclass
class CacheOps:
    """Cache copies of one step, applied by the runner: `restores` (snapshot slot → the sequence's state
    slot) before the forward; `saves[seq_id]` = (offset, snapshot slot): the state after the sequence's
    first `offset` new tokens of this step is copied into the snapshot slot."""

    restores: list[tuple[int, int]] = field(default_factory=list)
    saves: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class _PendingSnapshot:
    seq: Sequence
    slot: int
    hash: BlockHash
    is_rolling: bool  # replaced by the sequence's next rolling snapshot


@dataclass
class Fork:
    """Children created from a parent whose prefill completed, and the cache copies they need."""

    children: list[Sequence]
    block_copies: list[tuple[int, int, int]]  # (KV group, src block, dst block): the partial last block
    state_copies: list[tuple[int, int]]  # (src slot, dst slot)


class CacheManager:
    def __init__(
        self,
        plan: CachePlan,
        has_paged: bool,
        has_state: bool,
        enable_prefix_caching: bool = True,
        snapshot_interval: int = 8,
    ) -> None:
        self.block_size = plan.block_size
        self.pools = (
            [
                BlockAllocator(n, plan.block_size, w)
                for n, w in zip(plan.group_blocks, plan.windows, strict=True)
            ]
            if has_paged
            else []
        )  # one per KV group
        self.blocks = self.pools[0] if self.pools else None  # the first group's (full attention, if any)
        self.slots = SlotAllocator(plan.num_state_slots) if has_state else None
        self.is_prefix_caching = enable_prefix_caching
        self.snapshots = (
            SnapshotPool(plan.num_state_slots, plan.num_snapshots)
            if has_state and enable_prefix_caching and plan.num_snapshots > 0
            else None
        )
        self.snapshot_interval = max(1, snapshot_interval)
        # the drafts' scratch state slots: the state pool's rows after the running slots and snapshots
        first_spec = plan.num_state_slots + plan.num_snapshots
        spec = range(first_spec, first_spec + plan.num_spec_slots) if has_state else range(0)
        self._spec_free = list(reversed(spec))  # popped from the end: lowest first
        self._spec_held: dict[int, int] = {}  # seq_id → its scratch slot
        self.queries = 0  # prompt tokens looked up (first admissions)
        self.hits = 0  # of those, tokens found cached
        self._ops = CacheOps()
        self._pending: list[_PendingSnapshot] = []

    # ------------------------------------------------------------------------------------------ stats

    @property
    def usage(self) -> float:
        return self.blocks.usage if self.blocks is not None else 0.0

    @property
    def num_snapshots(self) -> int:
        return self.snapshots.num_held if self.snapshots is not None else 0

    def num_free_slots(self) -> int:
        return self.slots.num_free if self.slots is not None else 1 << 30

    # -------------------------------------------------------------------------------------- admission

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[BlockHash]:
        """seq.block_hashes extended to at least `num_blocks` blocks (all full blocks of its tokens)."""
        have = len(seq.block_hashes)
        if have < num_blocks:
            bs = self.block_size
            tokens = seq.tokens(have * bs, num_blocks * bs)
            extend_hashes(seq.block_hashes, tokens, bs, hash_root(seq.params.cache_salt))
        return seq.block_hashes

    def _match(self, seq: Sequence) -> tuple[list[list[int]], int, int | None]:
        """The longest usable cached prefix of `seq`: (per KV group the table of blocks to share — a sliding
        group's led by `DROPPED` entries —, tokens, snapshot slot or None)."""
        max_blocks = (seq.num_tokens - 1) // self.block_size  # at least one token left to compute
        none: tuple[list[list[int]], int, None] = ([[] for _ in self.pools], 0, None)
        if not self.is_prefix_caching or max_blocks == 0:
            return none
        if seq.params.prompt_logprobs is not None and not seq.output_ids:
            return none
        if seq.params.pooling is not None and seq.params.pooling.needs_every_position:
            return none
        hashes = self._hashes(seq, max_blocks)[:max_blocks]
        depth = len(hashes)
        full = [p for p in self.pools if p.window is None]
        for pool in full:  # full attention: every block from the first
            depth = next((i for i, h in enumerate(hashes[:depth]) if pool.lookup(h) is None), depth)
        sliding = [(p, self._last_missing(p, hashes[:depth])) for p in self.pools if p.window is not None]

        def is_usable(d: int) -> bool:  # each sliding group holds the blocks a step from d blocks reads
            return all(miss[d] < p.first_needed(d * self.block_size) for p, miss in sliding)

        snapshot = None
        if self.slots is not None and self.snapshots is None:
            return none
        while depth and not (
            is_usable(depth) and (self.snapshots is None or hashes[depth - 1] in self.snapshots)
        ):
            depth -= 1
        if self.snapshots is not None and depth:  # recurrent layers resume only where a snapshot was kept
            snapshot = self.snapshots.lookup(hashes[depth - 1])
        hits = []
        for pool in self.pools:
            k0 = pool.first_needed(depth * self.block_size) if depth else 0
            table = [DROPPED] * k0 + [pool.lookup(h) for h in hashes[k0:depth]]
            hits.append(table)
        return hits, depth * self.block_size, snapshot

    @staticmethod
    def _last_missing(pool: BlockAllocator, hashes: list[BlockHash]) -> list[int]:
        """miss[d] = the last block index < d whose hash `pool` does not hold (−1: none), d = 0..len."""
        miss = [-1]
        for i, h in enumerate(hashes):
            miss.append(miss[-1] if pool.lookup(h) is not None else i)
        return miss

    def admit(self, seq: Sequence, budget: int) -> int:
        """Give a waiting sequence its cache: the cached prefix (if any), blocks for the next
        min(uncomputed, budget) tokens and a state slot. Returns that token count, or 0 when memory is
        short (nothing is taken then). The caller has checked `num_free_slots()`."""
        hits, num_cached, snapshot = self._match(seq)
        num_new = min(seq.num_tokens - num_cached, budget)
        if num_new <= 0:
            return 0
        needs = []
        for pool, hit in zip(self.pools, hits, strict=True):
            need = pool.blocks_needed(num_cached + num_new, len(hit))
            num_revived = sum(
                1 for b in hit if b != DROPPED and pool.refs(b) == 0
            )  # hits leaving the free list
            if need + num_revived > pool.num_free:
                return 0
            needs.append(need)
        if self.pools:
            for pool, hit in zip(self.pools, hits, strict=True):
                pool.share([b for b in hit if b != DROPPED])
            seq.block_tables = [
                hit + pool.allocate(n) for pool, hit, n in zip(self.pools, hits, needs, strict=True)
            ]
            seq.num_registered_blocks = num_cached // self.block_size
        if self.slots is not None:
            seq.state_slot = self.slots.allocate()
            if snapshot is not None:
                self._ops.restores.append((snapshot, seq.state_slot))
        seq.num_computed_tokens = num_cached
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
            self.queries += seq.num_tokens
            self.hits += num_cached
        return num_new

    def grow(self, seq: Sequence, num_new: int) -> bool:
        """Blocks for `num_new` more tokens of a running sequence, after dropping what its sliding windows no
        longer reach (False: memory is short; nothing is taken then)."""
        start = seq.num_computed_tokens
        needs = []
        for g, pool in enumerate(self.pools):
            self._trim(seq, g, start)
            need = pool.blocks_needed(start + num_new, len(seq.block_tables[g]))
            if not pool.can_allocate(need):
                return False
            needs.append(need)
        for g, (pool, need) in enumerate(zip(self.pools, needs, strict=True)):
            if need:
                seq.block_tables[g].extend(pool.allocate(need))
        return True

    def _trim(self, seq: Sequence, g: int, start: int) -> None:
        """Drop the blocks of group g's table that a step starting at position `start` does not read (a
        sliding window's past; dropped entries are always a prefix of the table)."""
        pool, table = self.pools[g], seq.block_tables[g]
        for k in range(min(pool.first_needed(start), len(table)) - 1, -1, -1):
            if table[k] == DROPPED:
                break
            pool.free([table[k]])
            table[k] = DROPPED

    def release(self, seq: Sequence) -> None:
        """Free a sequence's blocks (hashed ones stay cached) and state slot; its snapshots stay."""
        for pool, table in zip(self.pools, seq.block_tables, strict=False):
            pool.free([b for b in table if b != DROPPED])
        seq.block_tables = [[] for _ in self.pools] or [[]]
        seq.num_registered_blocks = 0
        if self.slots is not None and seq.state_slot is not None:
            self.slots.free(seq.state_slot)
        seq.state_slot = None

    # -------------------------------------------------------------------------------------- snapshots

    def plan_saves(self, seq: Sequence, num_new: int) -> None:
        """Reserve snapshot slots for the kept block boundaries that `seq` passes this step."""
        if self.snapshots is None:
            return
        bs, k = self.block_size, self.snapshot_interval
        start = seq.num_computed_tokens
        first, last = start // bs + 1, (start + num_new) // bs  # boundaries b·bs in (start, start + num_new]
        if first > last:
            return
        prompt_last = (seq.num_prompt_tokens - 1) // bs
        hashes = self._hashes(seq, last)
        for b in range(first, last + 1):
            is_kept = b % k == 0 or b == prompt_last
            if not (is_kept or b == last) or hashes[b - 1] in self.snapshots:
                continue
            slot = self.snapshots.reserve()
            if slot is None:
                return
            self._pending.append(_PendingSnapshot(seq, slot, hashes[b - 1], not is_kept))
            self._ops.saves.setdefault(seq.seq_id, []).append((b * bs - start, slot))

    def take_ops(self) -> CacheOps:
        """The copies the scheduled step needs (handed to the runner with the batch)."""
        ops, self._ops = self._ops, CacheOps()
        return ops

    # --------------------------------------------------------------------------------------- drafts

    def reserve_drafts(self, seq: Sequence) -> bool:
        """With recurrent state: a scratch slot that receives `seq`'s state before the step (the state to
        return to if a draft is rejected); False when none is free. Stateless models keep nothing: True."""
        if self.slots is None:
            return True
        if not self._spec_free:
            return False
        assert seq.state_slot is not None
        scratch = self._spec_free.pop()
        self._spec_held[seq.seq_id] = scratch
        self._ops.restores.append((seq.state_slot, scratch))
        return True

    def settle_drafts(self, seq: Sequence, is_whole: bool) -> list[tuple[int, int]]:
        """`seq`'s verification kept every draft (`is_whole`) or not: the (scratch → its state slot) copy
        that puts its state back to where the step began — none when all were kept, the sequence holds no
        slot any more (it finished) or has no recurrent state — with the scratch slot freed."""
        scratch = self._spec_held.pop(seq.seq_id, None)
        if scratch is None:
            return []
        self._spec_free.append(scratch)
        if is_whole or seq.state_slot is None:
            return []
        return [(scratch, seq.state_slot)]

    @property
    def replays_rejected(self) -> bool:
        """Whether a rejected draft makes its step's kept tokens be computed again (recurrent state)."""
        return self.slots is not None

    # ---------------------------------------------------------------------------------- after a step

    def commit(self, seqs: list[Sequence]) -> None:
        """The step succeeded (and `num_computed_tokens` moved on): name the blocks it completed and the
        snapshots it wrote."""
        if self.is_prefix_caching and self.pools:
            bs = self.block_size
            for seq in seqs:
                num_full = min(seq.num_computed_tokens // bs, len(seq.block_table))
                if num_full > seq.num_registered_blocks:
                    hashes = self._hashes(seq, num_full)
                    for pool, table in zip(self.pools, seq.block_tables, strict=True):
                        for i in range(seq.num_registered_blocks, num_full):
                            if table[i] != DROPPED:
                                pool.register(table[i], hashes[i])
                    seq.num_registered_blocks = num_full
        for seq in seqs:  # for the next step (a drafted one may be computed again from its start: `grow`)
            if not seq.draft_ids:
                for g in range(len(self.pools)):
                    self._trim(seq, g, max(0, seq.num_computed_tokens - 1))
        for p in self._pending:
            assert self.snapshots is not None
            self.snapshots.commit(p.slot, p.hash)
            if p.seq.latest_snapshot is not None and p.seq.latest_snapshot != p.hash:
                self.snapshots.drop(p.seq.latest_snapshot)  # a newer boundary replaces the rolling one
            p.seq.latest_snapshot = p.hash if p.is_rolling else None
        self._pending = []

    def rollback(self) -> None:
        """The step failed: give back the snapshot slots it reserved (nothing of it is named)."""
        for p in self._pending:
            assert self.snapshots is not None
            self.snapshots.unreserve(p.slot)
        self._pending = []
        self._ops = CacheOps()
        self._spec_free.extend(self._spec_held.values())
        self._spec_held.clear()

    # ---------------------------------------------------------------------------------------- forking

    def fork(self, parent: Sequence, children: list[Sequence]) -> tuple[Fork, list[Sequence]]:
        """Give `children` the parent's cache: shared full blocks, a copy of the partial last block, a copy
        of the recurrent state. Returns the fork and the children that found no block for their copy."""
        fork = Fork([], [], [])
        left_out = []
        num_full = parent.num_computed_tokens // self.block_size
        for child in children:
            partial = [num_full < len(t) for t in parent.block_tables[: len(self.pools)]]
            if any(p and not pool.can_allocate(1) for p, pool in zip(partial, self.pools, strict=True)):
                left_out.append(child)
                continue
            if self.pools:
                child.block_tables = []
                for g, (pool, table) in enumerate(zip(self.pools, parent.block_tables, strict=True)):
                    shared = table[:num_full]
                    pool.share([b for b in shared if b != DROPPED])
                    own = list(shared)
                    if partial[g]:
                        (fresh,) = pool.allocate(1)
                        fork.block_copies.append((g, table[num_full], fresh))
                        own.append(fresh)
                    child.block_tables.append(own)
                child.num_registered_blocks = min(num_full, parent.num_registered_blocks)
            if self.slots is not None:
                child.state_slot = self.slots.allocate()
                assert parent.state_slot is not None
                fork.state_copies.append((parent.state_slot, child.state_slot))
            child.num_computed_tokens = parent.num_computed_tokens
            child.block_hashes = list(parent.block_hashes)
            child.num_cached_tokens = parent.num_cached_tokens
            fork.children.append(child)
        return fork, left_out
