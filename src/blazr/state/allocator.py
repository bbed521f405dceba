"""Bookkeeping for the cache pools (pure Python; the tensors live in kv_cache.py):

- `BlockAllocator`: paged token blocks, reference-counted (n > 1 samples and prefix-cache hits share full
  blocks). A full block may carry the hash of the prefix it holds (state/prefix.py); when its last user
  frees it, it stays findable by that hash until a new allocation needs the memory — free blocks are reused
  least recently freed first (LRU), and reusing a hashed block drops its hash.
- `SlotAllocator`: recurrent-state slots (Mamba2 conv + SSM state), one per running sequence.
- `SnapshotPool`: further state slots holding copies of a sequence's recurrent state at a block boundary,
  found by the hash of the prefix they follow; evicted least recently used first.

A KV group (state/layout.py) has one `BlockAllocator`; a sliding group's knows its `window` and which
blocks a step still reads (`first_needed`): the engine drops the rest from a sequence's table
(engine/cache_manager.py).

Slots of the two state kinds index one state pool: running slots are [0, num_slots), snapshot slots
[first, first + num_snapshots).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from blazr.state.prefix import BlockHash

DROPPED = -1  # a block table's entry for a block its sliding window no longer reaches


class BlockAllocator:
    """`num_blocks` blocks of `block_size` token slots, with reference counts and an index of full blocks by
    prefix hash; `window`: the sliding window of its KV group's layers (None: full attention)."""

    def __init__(self, num_blocks: int, block_size: int, window: int | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take (cached ones included: they are evicted on demand)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks findable by hash (in use or not)."""
        return len(self._block_of)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences (cached free blocks count as free)."""
        return 1.0 - len(self._free) / self.num_blocks if self.num_blocks else 0.0

    def first_needed(self, start: int) -> int:
        """The first block a step whose first new token is at position `start` reads: 0 for full attention;
        with a window W, the block of position start − W + 1 (the oldest key that token sees; later tokens
        of the step see later keys only)."""
        if self.window is None:
            return 0
        return max(0, start - self.window + 1) // self.block_size

    def blocks_needed(self, num_tokens: int, num_blocks_held: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - num_blocks_held)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """n blocks with one reference each, taken least recently freed first (dropping their hashes)."""
        assert n <= len(self._free), "allocate() without can_allocate()"
        blocks = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            if (h := self._hash_of.pop(b, None)) is not None:
                del self._block_of[h]
            self._refs[b] = 1
            blocks.append(b)
        return blocks

    def share(self, blocks: list[int]) -> None:
        """One more reference on each block (a free cached block leaves the free list)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each block. Blocks reaching zero join the free list in reverse order, so
        that a sequence's tail blocks (the least shareable) are reused before its head."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            assert self._refs[b] >= 0, f"block {b} freed twice"
            if self._refs[b] == 0:
                self._free[b] = None

    def refs(self, block: int) -> int:
        return self._refs[block]

    # ---------------------------------------------------------------------------------- prefix index

    def lookup(self, h: BlockHash) -> int | None:
        """The block holding the prefix hashed `h`, if it is still cached."""
        return self._block_of.get(h)

    def register(self, block: int, h: BlockHash) -> None:
        """Name a full, computed block by its prefix hash. A hash already held by another block (two
        sequences computed the same prefix at once) keeps its first block; this one stays anonymous."""
        if h in self._block_of or block in self._hash_of:
            return
        self._block_of[h] = block
        self._hash_of[block] = h

    def slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size


class SlotAllocator:
    """Free list of recurrent-state slots (Mamba2 conv + SSM state), one per running sequence."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        assert self._free, "allocate() with no free state slot"
        return self._free.popleft()

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"state slot {slot} freed twice"
        self._free.append(slot)


class SnapshotPool:
    """Recurrent-state snapshots by prefix hash, in slots [first, first + num_snapshots) of the state pool.

    A snapshot is written by a forward step: `reserve()` takes a slot before the step (evicting the least
    recently used snapshot when none is free) and `commit()` names it after the step succeeded (`unreserve()`
    if it failed). Reserved slots are never evicted, so one step's writes never collide."""

    def __init__(self, first: int, num_snapshots: int) -> None:
        self.first = first
        self.num_snapshots = num_snapshots
        self._free: deque[int] = deque(range(first, first + num_snapshots))
        self._lru: OrderedDict[BlockHash, int] = OrderedDict()  # committed, least recently used first
        self._hash_of: dict[int, BlockHash] = {}

    @property
    def num_held(self) -> int:
        """Committed snapshots."""
        return len(self._lru)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self._lru

    def lookup(self, h: BlockHash) -> int | None:
        """The slot of the snapshot after the prefix hashed `h` (now the most recently used), if cached."""
        slot = self._lru.get(h)
        if slot is not None:
            self._lru.move_to_end(h)
        return slot

    def reserve(self) -> int | None:
        """A slot for a snapshot to be written this step, or None when every slot is reserved."""
        if self._free:
            return self._free.popleft()
        if not self._lru:
            return None
        _, slot = self._lru.popitem(last=False)
        del self._hash_of[slot]
        return slot

    def commit(self, slot: int, h: BlockHash) -> None:
        """The step that wrote reserved `slot` succeeded: find it by `h` from now on (a duplicate of a
        snapshot already held is let go)."""
        if h in self._lru:
            self._free.append(slot)
            return
        self._lru[h] = slot
        self._hash_of[slot] = h

    def unreserve(self, slot: int) -> None:
        """Give back a reserved slot whose step failed."""
        assert slot not in self._hash_of, f"snapshot slot {slot} is not reserved"
        self._free.append(slot)

    def drop(self, h: BlockHash) -> None:
        """Forget the snapshot after prefix `h`, if still held."""
        slot = self._lru.pop(h, None)
        if slot is not None:
            del self._hash_of[slot]
            self._free.append(slot)
