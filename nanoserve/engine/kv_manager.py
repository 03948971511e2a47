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

**Sliding windows (Day 70).** When *every* layer attends through a window (Mistral; with
different windows the widest counts), a key at position j is never read again once the next
position the request computes, ``num_computed_tokens``, is at least ``j + window``: every later
query i sees only ``i - window < j``. So before each step ``free_out_of_window`` gives back every
block whose last position p has ``p <= num_computed_tokens - window`` (vLLM's sliding-window
manager does the same). The block's place in the request's list, and in its cache row's table,
becomes a *placeholder*: the **null block**, block 0 of the pool, taken by the manager when it
is built and never handed to a request, so nothing ever writes it and it holds the zeros the cache
was made with. A placeholder is a valid block id, so a backend that gathers by cell (the
reference rectangle, the gathered mapping) reads finite zeros there and its window mask gives
them weight 0 (0 * finite = 0; a NaN there would poison the output, which a cell another request
reuses could not be trusted not to hold forever), and a kernel that skips out-of-window blocks
never looks at it. The accounting is honest: the null block is one of the cache's blocks that no
request can use, so ``num_blocks`` (and usage, the door check, the drain check) counts
``num_kv_blocks - 1`` usable blocks, as vLLM's pool does.

With prefix caching a freed full block goes back like any freed cached block (evictable, its hash
kept), and a hit needs only the blocks inside the window of the first position it computes
(vLLM's rule, ``CachingBlockAllocator.match_window``): the earlier ones become placeholders, taken
by nobody, and may have been evicted already. When only some layers are windowed (Gemma 3's
local layers, Qwen's ``max_window_layers``) every block is kept: the pool is one for all layers
and a global layer reads every key. vLLM's hybrid allocator keeps a pool per group of layers and
would free the local layers' share: with Gemma 3's five local layers to one global, a window of
1,024 and a 32k context, the KV held would be 1/6 + 5/6 * 1024/32768, about 19% of what a single
pool keeps. That is not done here; the load log says so.

>>> kv = KVCacheManager(num_blocks=4, block_size=16)
>>> kv.blocks_for_length(33), kv.num_free, kv.usage
(3, 4, 0.0)
>>> blocks = kv.allocate(3); kv.usage
0.75
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nanoserve.engine.block_allocator import BlockAllocator
from nanoserve.engine.prefix_cache import CachingBlockAllocator, commit_blocks, match_prefix
from nanoserve.validation import InvalidRequest

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig
    from nanoserve.engine.request import Request

log = logging.getLogger("nanoserve")
NULL_BLOCK = 0  # the placeholder of a block a window gave back: the pool's first block


def freeing_window(windows) -> int | None:
    """The window to free blocks by: the widest, when every layer has one; else None (a
    global layer reads every key, so every block is kept)."""
    windows = tuple(windows or ())
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)


def out_of_window(next_pos: int, window: int, block_size: int) -> int:
    """Leading blocks no query at ``next_pos`` or later reads: those whose last position p has
    p <= next_pos - window, i.e. the first (next_pos - window + 1) // block_size blocks.

    >>> out_of_window(64, 64, 16), out_of_window(78, 64, 16), out_of_window(79, 64, 16)
    (0, 0, 1)
    """
    return max(0, (next_pos - window + 1) // block_size)


class NoCaching:
    """Prefix caching off: no lookup, nothing registered, nothing counted."""

    queries = hits = num_cached = 0
    window: int | None = None

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

    def __init__(self, pool: CachingBlockAllocator, window: int | None = None):
        self.pool = pool
        self.window = window  # every layer windowed: a hit needs only its window's blocks
        self.queries = 0  # prompt tokens of new requests looked up (Day 44)
        self.hits = 0  # ... of which were found cached

    @property
    def num_cached(self) -> int:
        return self.pool.num_cached

    def find(self, request: Request) -> list[int]:
        """The cached blocks ``request`` can start from (nothing is taken or counted yet); with
        a window, placeholders (``NULL_BLOCK``) for the blocks before it."""
        return match_prefix(self.pool, request, self.window, NULL_BLOCK)

    def free_cost(self, hit: list[int]) -> int:
        return self.pool.free_cost(live_blocks(hit, self.window))

    def take(self, hit: list[int], request: Request) -> None:
        """``request`` is admitted with ``hit``: one more holder for each block, and its
        lookup counted if it is new (a resumed request's is not, as vLLM counts them)."""
        self.pool.take(live_blocks(hit, self.window))
        if not request.num_preemptions:
            self.queries += request.num_tokens
            self.hits += len(hit) * self.pool.block_size

    def commit(self, request: Request) -> None:
        commit_blocks(self.pool, request)

    def forget(self, blocks: list[int]) -> None:
        self.pool.forget(blocks)


def live_blocks(blocks: list[int], window: int | None) -> list[int]:
    """``blocks`` less their placeholders (there are none without a freeing window)."""
    return list(blocks) if window is None else [b for b in blocks if b != NULL_BLOCK]


class KVCacheManager:
    """Blocks for requests from one pool of ``num_blocks`` blocks of ``block_size`` tokens.

    ``windows``: each layer's sliding window (None: full attention). When every layer has one,
    blocks behind the widest go back to the pool while their request runs (see the module
    docstring) and block 0 is the null block; ``window`` is then that width, else None."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 windows: tuple[int | None, ...] = ()):
        self.window = freeing_window(windows)
        if prefix_caching:
            self.pool = CachingBlockAllocator(num_blocks, block_size)
            self.prefix: NoCaching | PrefixCaching = PrefixCaching(self.pool, self.window)
        else:
            self.pool = BlockAllocator(num_blocks, block_size)
            self.prefix = NoCaching()
        self.reserved = 0  # blocks of the pool no request can hold: the null block
        self.null_block: int | None = None
        self.window_freed = 0  # blocks given back by the window while their request ran
        if self.window is not None:
            if num_blocks < 2:
                raise ValueError(f"num_kv_blocks={num_blocks}: a windowed model's pool keeps "
                                 f"block 0 as its null block, so it needs at least 2")
            self.null_block, = self.pool.allocate(1)
            assert self.null_block == NULL_BLOCK  # the lowest id of an empty pool
            self.reserved = 1
            log.info("every layer attends through a window of %d tokens: blocks behind it go "
                     "back to the pool while their request runs (block %d is the null block; "
                     "%d of %d blocks usable)", self.window, NULL_BLOCK, self.num_blocks,
                     num_blocks)
        elif any(w is not None for w in windows):
            glob = [i for i, w in enumerate(windows) if w is None]
            log.info("layers %s attend to every key, so every KV block is kept for all layers "
                     "(one pool; a pool per layer group, vLLM's hybrid allocator, would free "
                     "the windowed layers' blocks: not done)", glob)

    @classmethod
    def from_config(cls, config: EngineConfig, num_blocks: int,
                    windows: tuple[int | None, ...] = ()) -> KVCacheManager:
        return cls(num_blocks, config.block_size, config.enable_prefix_caching, windows)

    # ------------------------------------------------------------------ what it holds

    @property
    def num_blocks(self) -> int:
        """Blocks requests can hold: the pool's, less the null block where there is one."""
        return self.pool.num_blocks - self.reserved

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def num_free(self) -> int:
        """Blocks nobody holds (cached ones included: they are evictable)."""
        return self.pool.num_free

    @property
    def num_held(self) -> int:
        """Blocks requests hold (the null block is nobody's)."""
        return self.pool.num_held - self.reserved

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
        """The cached blocks a waiting request can start from (none without caching, and none
        for a request that asks for prompt logprobs: a cached position's logits are never
        computed, so it reads nothing from the cache, as vLLM's
        ``skip_reading_prefix_cache``; what it computes is still cached for others)."""
        if getattr(request.params, "prompt_logprobs", None) is not None:
            return []
        return self.prefix.find(request)

    def can_allocate(self, n: int, hit: list[int] = ()) -> bool:
        """Can ``n`` new blocks be given, beside taking the cached blocks of ``hit``?"""
        return self.pool.can_allocate(n + (self.prefix.free_cost(hit) if hit else 0))

    def allocate(self, n: int) -> list[int]:
        """``n`` new blocks, all or none."""
        return self.pool.allocate(n)

    def admit(self, request: Request, hit: list[int], n: int) -> list[int]:
        """A newcomer's blocks: its cached prefix ``hit`` (taken; its placeholders not), then
        ``n`` new ones."""
        self.prefix.take(hit, request)
        request.num_null_blocks = len(hit) - len(live_blocks(hit, self.window))
        return list(hit) + self.pool.allocate(n)

    def free(self, blocks: list[int]) -> None:
        """Give back a request's blocks; its placeholders are nobody's to give."""
        self.pool.free(live_blocks(blocks, self.window))

    def free_out_of_window(self, request: Request) -> int:
        """Before a step: give back the request's blocks that no query from its next position
        on can see (every layer windowed; otherwise nothing). Each becomes a placeholder in
        ``request.blocks`` (the engine copies it into the cache row's table at its next step);
        a hashed one stays findable, as any freed cached block. Returns the blocks freed."""
        if self.window is None:
            return 0
        k = min(out_of_window(request.num_computed_tokens, self.window, self.block_size),
                len(request.blocks))
        first = request.num_null_blocks
        if k <= first:
            return 0
        gone = request.blocks[first:k]
        request.blocks[first:k] = [NULL_BLOCK] * (k - first)
        request.num_null_blocks = k
        self.pool.free(gone)
        self.window_freed += len(gone)
        return len(gone)

    def commit(self, request: Request) -> None:
        """The blocks this step fills become findable (with caching)."""
        self.prefix.commit(request)

    def forget(self, blocks: list[int]) -> None:
        """A step that failed never wrote these blocks' K/V: nothing may find them."""
        self.prefix.forget(live_blocks(blocks, self.window))

    # ------------------------------------------------------------------ what it costs

    def fragmentation_waste(self, running: list[Request]) -> float:
        """Share of the slots in running requests' occupied blocks that no token fills: the
        tail of each sequence's last block, at most block_size - 1 tokens per sequence."""
        bs = self.block_size  # blocks a window gave back hold no slot and no token
        slots = sum(self.blocks_for_length(r.num_tokens) - r.num_null_blocks
                    for r in running) * bs
        if slots == 0:
            return 0.0
        return 1 - sum(r.num_tokens - r.num_null_blocks * bs for r in running) / slots

    def reservation_waste(self, running: list[Request]) -> float:
        """Share of the blocks held by running requests that hold no token yet (0.0 by
        construction under ``incremental``: held and needed come from the same number)."""
        reserved = sum(len(r.blocks) - r.num_null_blocks for r in running)
        if reserved == 0:
            return 0.0
        occupied = sum(min(len(r.blocks), self.blocks_for_length(r.num_tokens))
                       - r.num_null_blocks for r in running)
        return 1 - occupied / reserved

    def check_invariants(self) -> None:
        self.pool.check_invariants()
