"""Bookkeeping for the cache pools: paged token blocks (ref-counted, so n > 1 samples share a prompt) and
recurrent-state slots (one per running sequence). Pure Python; the tensors live in kv_cache.py.
"""

from __future__ import annotations

from collections import deque


class BlockAllocator:
    """Free list of `num_blocks` blocks of `block_size` token slots, with reference counts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks if self.num_blocks else 0.0

    def blocks_needed(self, num_tokens: int, num_blocks_held: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - num_blocks_held)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        assert n <= len(self._free), "allocate() without can_allocate()"
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._refs[b] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            self._refs[b] -= 1
            assert self._refs[b] >= 0, f"block {b} freed twice"
            if self._refs[b] == 0:
                self._free.append(b)

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
