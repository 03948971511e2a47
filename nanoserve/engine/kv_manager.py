"""``KVCacheManager``: the scheduler's KV pool, with prefix caching as its policy.

Why this module exists: the scheduler decides who gets KV blocks and when; which blocks, whether a
prompt's first blocks are already cached, and what a finished step leaves findable are the pool's
business. So the scheduler owns one manager, built from the engine's config, and asks it; it
never asks whether caching is on. With prefix caching (Day 43) the pool is a
``CachingBlockAllocator`` and the manager's ``PrefixCaching`` policy finds a newcomer's cached
blocks, registers the blocks each step fills and counts the lookups (vLLM's prefix-cache
queries and hits); without it the ``NoCaching`` policy finds nothing and keeps nothing.

The door check lives here too: a request whose worst case exceeds the whole empty pool could
never be admitted, and waiting for it would hang.

>>> kv = KVCacheManager(num_blocks=4, block_size=16)
>>> kv.blocks_for_length(33), kv.num_free, kv.usage
(3, 4, 0.0)
>>> blocks = kv.allocate(3); kv.usage
0.75
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanoserve.engine.block_allocator import BlockAllocator
from nanoserve.engine.prefix_cache import CachingBlockAllocator, commit_blocks, match_prefix
from nanoserve.validation import InvalidRequest

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig
    from nanoserve.engine.request import Request


class NoCaching:
    """Prefix caching off: no lookup, nothing registered, nothing counted."""

    queries = hits = num_cached = 0

    def find(self, request: Request) -> list[int]:
        return []

    def free_cost(self, hit: list[int]) -> int:
        return 0

    def take(self, hit: list[int], request: Request) -> None:
        pass

    def commit(self, request: Request) -> None:
        pass

    def forget(self, blocks: list[int]) -> None:
        pass


class PrefixCaching:
    """Day 43: full blocks found again by the chained hash of their tokens."""

    def __init__(self, pool: CachingBlockAllocator):
        self.pool = pool
        self.queries = 0  # prompt tokens of new requests looked up (Day 44)
        self.hits = 0  # ... of which were found cached

    @property
    def num_cached(self) -> int:
        return self.pool.num_cached

    def find(self, request: Request) -> list[int]:
        """The cached blocks ``request`` can start from (nothing is taken or counted yet)."""
        return match_prefix(self.pool, request)

    def free_cost(self, hit: list[int]) -> int:
        return self.pool.free_cost(hit)

    def take(self, hit: list[int], request: Request) -> None:
        """``request`` is admitted with ``hit``: one more holder for each block, and its
        lookup counted if it is new (a resumed request's is not, as vLLM counts them)."""
        self.pool.take(hit)
        if not request.num_preemptions:
            self.queries += request.num_tokens
            self.hits += len(hit) * self.pool.block_size

    def commit(self, request: Request) -> None:
        commit_blocks(self.pool, request)

    def forget(self, blocks: list[int]) -> None:
        self.pool.forget(blocks)


class KVCacheManager:
    """Blocks for requests from one pool of ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        if prefix_caching:
            self.pool = CachingBlockAllocator(num_blocks, block_size)
            self.prefix: NoCaching | PrefixCaching = PrefixCaching(self.pool)
        else:
            self.pool = BlockAllocator(num_blocks, block_size)
            self.prefix = NoCaching()

    @classmethod
    def from_config(cls, config: EngineConfig, num_blocks: int) -> KVCacheManager:
        return cls(num_blocks, config.block_size, config.enable_prefix_caching)

    # ------------------------------------------------------------------ what it holds

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def num_free(self) -> int:
        """Blocks nobody holds (cached ones included: they are evictable)."""
        return self.pool.num_free

    @property
    def num_held(self) -> int:
        return self.pool.num_held

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks held by requests, 0 to 1 (vLLM's kv_cache_usage)."""
        return 1 - self.num_free / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks the prefix cache can find, held or not (0 without caching)."""
        return self.prefix.num_cached

    @property
    def evictions(self) -> int:
        """Cached blocks given up for new K/V (0 without caching)."""
        return self.pool.evictions

    @property
    def prefix_cache_queries(self) -> int:
        return self.prefix.queries

    @property
    def prefix_cache_hits(self) -> int:
        return self.prefix.hits

    def blocks_for_length(self, num_tokens: int) -> int:
        return self.pool.blocks_for_length(num_tokens)

    # ------------------------------------------------------------------ requests

    def check_fits(self, request: Request, who: str) -> None:
        """The door check: refuse a request whose worst case exceeds the whole empty pool.
        Under incremental allocation it is also what guarantees that a request left alone in
        the pool always fits."""
        need = self.blocks_for_length(request.worst_case_tokens)
        if need > self.num_blocks:
            raise InvalidRequest(
                f"{who}: prompt + max_tokens = {request.worst_case_tokens} tokens need {need} KV "
                f"blocks; the pool has {self.num_blocks} of {self.block_size} tokens, so "
                f"it could never run (raise num_kv_blocks or lower max_tokens)", "max_tokens",
                request.worst_case_tokens)

    def find_prefix(self, request: Request) -> list[int]:
        """The cached blocks a waiting request can start from (none without caching)."""
        return self.prefix.find(request)

    def can_allocate(self, n: int, hit: list[int] = ()) -> bool:
        """Can ``n`` new blocks be given, beside taking the cached blocks of ``hit``?"""
        return self.pool.can_allocate(n + (self.prefix.free_cost(hit) if hit else 0))

    def allocate(self, n: int) -> list[int]:
        """``n`` new blocks, all or none."""
        return self.pool.allocate(n)

    def admit(self, request: Request, hit: list[int], n: int) -> list[int]:
        """A newcomer's blocks: its cached prefix ``hit`` (taken), then ``n`` new ones."""
        self.prefix.take(hit, request)
        return list(hit) + self.pool.allocate(n)

    def free(self, blocks: list[int]) -> None:
        self.pool.free(blocks)

    def commit(self, request: Request) -> None:
        """The blocks this step fills become findable (with caching)."""
        self.prefix.commit(request)

    def forget(self, blocks: list[int]) -> None:
        """A step that failed never wrote these blocks' K/V: nothing may find them."""
        self.prefix.forget(blocks)

    # ------------------------------------------------------------------ what it costs

    def fragmentation_waste(self, running: list[Request]) -> float:
        """Share of the slots in running requests' occupied blocks that no token fills: the
        tail of each sequence's last block, at most block_size - 1 tokens per sequence."""
        slots = sum(self.blocks_for_length(r.num_tokens) for r in running) * self.block_size
        if slots == 0:
            return 0.0
        return 1 - sum(r.num_tokens for r in running) / slots

    def reservation_waste(self, running: list[Request]) -> float:
        """Share of the blocks held by running requests that hold no token yet (0.0 by
        construction under ``incremental``: held and needed come from the same number)."""
        reserved = sum(len(r.blocks) for r in running)
        if reserved == 0:
            return 0.0
        occupied = sum(min(len(r.blocks), self.blocks_for_length(r.num_tokens))
                       for r in running)
        return 1 - occupied / reserved

    def check_invariants(self) -> None:
        self.pool.check_invariants()
