"""BlockAllocator: the KV pool cut into fixed-size blocks, handed out from a free list.

Why this module exists: a contiguous cache reserves ``max_model_len`` positions for every
sequence whether it uses them or not. Paging cuts the pool into blocks of ``block_size`` tokens
and gives a sequence only the blocks its tokens occupy, so the waste per sequence is at most
``block_size - 1`` tokens (the unused tail of its last block). This module is the bookkeeping:
which blocks are free, which are held, and a refusal for every operation that would corrupt that.

Rules, each enforced rather than assumed:

- ``allocate(n)`` is atomic: all ``n`` blocks or none, and a clear error when the pool is short.
- ``free(blocks)`` refuses a block that is already free, a block id the pool never had, and a
  block named twice in one call; nothing is released unless everything is valid.
- ``check_invariants()`` holds after every operation: free + held == total, no id twice.

Free blocks are handed out lowest id first, so runs are reproducible.

>>> a = BlockAllocator(num_blocks=4, block_size=16)
>>> a.blocks_for_length(33)
3
>>> blocks = a.allocate(3); blocks, a.num_free
([0, 1, 2], 1)
>>> a.free(blocks); a.num_free
4
"""

from __future__ import annotations

import heapq


class BlockAllocator:
    caching = False  # a prefix-caching pool (Day 43) is prefix_cache.CachingBlockAllocator
    evictions = 0  # cached blocks given up for new K/V: never, in a pool that caches nothing

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} "
                             f"and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))  # a heap: lowest id first
        self._is_free = [True] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_held(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for_length(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise ValueError(f"KV pool exhausted: asked for {n} blocks, {len(self._free)} of "
                             f"{self.num_blocks} are free")
        blocks = [heapq.heappop(self._free) for _ in range(n)]
        for b in blocks:
            self._is_free[b] = False
        return blocks

    def free(self, blocks: list[int]) -> None:
        seen: set[int] = set()
        for b in blocks:
            if not (isinstance(b, int) and 0 <= b < self.num_blocks):
                raise ValueError(f"block id {b!r} does not belong to this pool "
                                 f"(0..{self.num_blocks - 1})")
            if self._is_free[b] or b in seen:
                raise ValueError(f"double free of block {b}")
            seen.add(b)
        for b in blocks:
            self._is_free[b] = True
            heapq.heappush(self._free, b)

    def check_invariants(self) -> None:
        """free + held == total, every id exactly once; raises AssertionError if broken."""
        free = self._free
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert all(0 <= b < self.num_blocks for b in free), "a foreign id on the free list"
        assert sorted(free) == [b for b in range(self.num_blocks) if self._is_free[b]], \
            "the free list and the free flags disagree"
        assert self.num_free + self.num_held == self.num_blocks
