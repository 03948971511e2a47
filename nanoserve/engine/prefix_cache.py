"""Prefix caching (Day 43): full KV blocks found again by a hash of everything before them.

Why this module exists: 32 requests that share a 500-token system prompt compute the same K/V
32 times. A block's K/V depends only on its own tokens and every token before it, so a *full*
block can be named by a hash chained on its parent's: ``h_i = H(h_{i-1}, tokens of block i)``.
``CachingBlockAllocator`` keeps a hash -> block map beside the pool; a new request looks its
prompt's block hashes up in order and takes the longest run it finds, and its prefill starts at
the first uncached token.

The rules, each one a guard against a failure users of other engines have reported:

- **Full blocks only**, and the hash is deterministic (blake2b from a fixed seed, never
  Python's salted ``hash``): the same prompt names the same blocks in every process.
- **Token ids are compared on a hit**: a hash collision costs a miss, never wrong K/V.
- **Reference counts**: a block shared by several requests is held once and freed when its last
  holder lets go, so it is never counted twice as evictable.
- **Freed blocks keep their K/V and their hash**, in least-recently-freed order, and are evicted
  only when the pool has no never-cached block left to give. They count as *free* everywhere
  (``num_free``, KV usage, the drain check): nobody holds them.
- **Registered when scheduled**: a block enters the map as soon as the step that computes it
  is scheduled, so requests admitted together in one step share their common prefix (in a
  forward every layer writes the step's new K/V before any row reads it).
- **The last prompt token is always computed**: its logits pick the first output token, so a
  fully cached prompt still leaves its last block's last token to the forward.
- **A window needs only its blocks** (every layer windowed, Day 70): a hit of n blocks needs
  the blocks a query at position n * block_size can see, not the ones before them
  (``match_window``, vLLM's rule), so a prefix whose head was evicted still hits.

Invariants (``check_invariants``): every block is exactly one of free-uncached, free-cached or
held; a held block's count is its holders; the map and each cached block agree.

>>> a = CachingBlockAllocator(num_blocks=4, block_size=2)
>>> hashes = block_hashes([1, 2, 3, 4, 5], 2)
>>> len(hashes), a.match(hashes, [1, 2, 3, 4, 5])
(2, [])
>>> blocks = a.allocate(3); a.register(blocks[:2], hashes, [1, 2, 3, 4, 5]); a.free(blocks)
>>> a.num_free, a.num_cached, a.match(hashes, [1, 2, 3, 4, 5])
(4, 2, [0, 1])
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict

from nanoserve.engine.block_allocator import BlockAllocator

ROOT_HASH = hashlib.blake2b(b"nanoserve prefix cache", digest_size=16).digest()


def hash_block(parent: bytes, tokens) -> bytes:
    """The chained hash of one full block: its parent's hash and its token ids."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


def block_hashes(token_ids: list[int], block_size: int, known: list[bytes] = ()) -> list[bytes]:
    """Hashes of every full block of ``token_ids``, extending ``known`` (the first hashes,
    already computed): one hash per new full block, never a pass over the earlier ones."""
    out = list(known)
    parent = out[-1] if out else ROOT_HASH
    for i in range(len(out), len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


class CachingBlockAllocator(BlockAllocator):
    """A ``BlockAllocator`` whose freed full blocks stay findable by their chained hash."""

    caching = True

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._refs = [0] * num_blocks  # holders of each block
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._tokens_of: dict[int, tuple[int, ...]] = {}  # compared on every hit
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free, cached: oldest first
        self.evictions = 0  # cached blocks whose K/V was given up for a new tenant

    # ------------------------------------------------------------------ counting

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_held(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks the map can find, held or not."""
        return len(self._by_hash)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    # ------------------------------------------------------------------ the pool

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks for new K/V: never-cached ones first (lowest id), then the least
        recently freed cached ones, whose hashes are forgotten. All or nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > self.num_free:
            raise ValueError(f"KV pool exhausted: asked for {n} blocks, {self.num_free} of "
                             f"{self.num_blocks} are free")
        fresh = [heapq.heappop(self._free) for _ in range(min(n, len(self._free)))]
        for b in fresh:
            self._is_free[b] = False
        while len(fresh) < n:
            b, _ = self._evictable.popitem(last=False)
            self._forget(b)
            self.evictions += 1
            fresh.append(b)
        for b in fresh:
            self._refs[b] = 1
        return fresh

    def free(self, blocks: list[int]) -> None:
        """One holder lets go of each block; a block nobody holds is free again, findable
        still if it is cached. The whole call is checked before anything changes."""
        seen: set[int] = set()
        for b in blocks:
            if not (isinstance(b, int) and 0 <= b < self.num_blocks):
                raise ValueError(f"block id {b!r} does not belong to this pool "
                                 f"(0..{self.num_blocks - 1})")
            if self._refs[b] == 0 or b in seen:
                raise ValueError(f"double free of block {b}")
            seen.add(b)
        for b in reversed(blocks):  # a sequence's tail is evicted before its head
            self._refs[b] -= 1
            if self._refs[b]:
                continue
            if b in self._hash_of:
                self._evictable[b] = None
            else:
                self._is_free[b] = True
                heapq.heappush(self._free, b)

    # ------------------------------------------------------------------ the map

    def match(self, hashes: list[bytes], token_ids: list[int]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` whose tokens agree; no
        reference is taken (``take`` does that)."""
        bs, found = self.block_size, []
        for i, h in enumerate(hashes):
            b = self._by_hash.get(h)
            if b is None or self._tokens_of[b] != tuple(token_ids[i * bs:(i + 1) * bs]):
                break
            found.append(b)
        return found

    def match_window(self, hashes: list[bytes], token_ids: list[int], window: int,
                     null: int) -> list[int]:
        """The longest hit when every layer sees only ``window`` keys: n blocks, of which those
        a query at position n * bs can see (from block (n*bs - window + 1) // bs on) are
        cached with agreeing tokens; the blocks before them are ``null`` placeholders, looked
        up or not. The hit's last block is always cached. No reference is taken.

        Blocks that are skipped are not compared: the chained hash of a taken block still
        names every token before it (a collision there is the 2**-128 chance any hit takes)."""
        bs, best, run = self.block_size, 0, 0  # run: first block of the current cached run
        found: list[int | None] = []
        for i, h in enumerate(hashes):
            b = self._by_hash.get(h)
            if b is not None and self._tokens_of[b] != tuple(token_ids[i * bs:(i + 1) * bs]):
                b = None
            found.append(b)
            if b is None:
                run = i + 1
            elif run <= max(0, ((i + 1) * bs - window + 1) // bs):
                best = i + 1
        skip = max(0, (best * bs - window + 1) // bs)
        return [null] * skip + found[skip:best]

    def free_cost(self, blocks: list[int]) -> int:
        """Free blocks that taking ``blocks`` would use up: those nobody holds now."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def take(self, blocks: list[int]) -> None:
        """One more holder for each cached block of a hit."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._evictable[b]
            self._refs[b] += 1

    def register(self, blocks: list[int], hashes: list[bytes], token_ids: list[int]) -> None:
        """Make full blocks findable: ``blocks[i]`` holds tokens ``i*bs .. (i+1)*bs - 1`` with
        hash ``hashes[i]``. A hash that already names another block keeps that one."""
        bs = self.block_size
        for i, (b, h) in enumerate(zip(blocks, hashes, strict=True)):
            if b in self._hash_of or h in self._by_hash:
                continue
            self._by_hash[h], self._hash_of[b] = b, h
            self._tokens_of[b] = tuple(token_ids[i * bs:(i + 1) * bs])

    def forget(self, blocks: list[int]) -> None:
        """Drop the hashes of ``blocks`` (their K/V was never written: a failed step)."""
        for b in blocks:
            if b in self._hash_of:
                self._forget(b)
                if self._refs[b] == 0:
                    del self._evictable[b]
                    self._is_free[b] = True
                    heapq.heappush(self._free, b)

    def _forget(self, b: int) -> None:
        del self._by_hash[self._hash_of.pop(b)]
        del self._tokens_of[b]

    def check_invariants(self) -> None:
        """Every block free-uncached, free-cached or held, exactly one; counts add up."""
        free, evictable = set(self._free), set(self._evictable)
        held = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not (free & evictable or free & held or evictable & held), "a block in two states"
        assert len(free) + len(evictable) + len(held) == self.num_blocks, "a block is lost"
        assert all(self._is_free[b] == (b in free) for b in range(self.num_blocks))
        assert evictable <= set(self._hash_of), "an evictable block has no hash"
        assert all(self._by_hash[h] == b for b, h in self._hash_of.items()), "map disagrees"
        assert len(self._by_hash) == len(self._hash_of) == len(self._tokens_of)


# ---------------------------------------------------------------------------- a request's view

def match_prefix(allocator: CachingBlockAllocator, request, window: int | None = None,
                 null: int = 0) -> list[int]:
    """The cached blocks a waiting request can start from: the longest hashed prefix of its
    tokens, short of its last token (whose logits pick the next one). Hashes are kept on the
    request, so a resumed request hashes only blocks it has not hashed before. ``window``:
    every layer's widest window, where every layer has one (``match_window``; ``null`` is the
    placeholder of a block the hit does not need)."""
    bs = allocator.block_size
    ids = request.token_ids
    request.block_hashes = block_hashes(ids, bs, request.block_hashes)
    hashes = request.block_hashes[:(len(ids) - 1) // bs]
    if window is None:
        return allocator.match(hashes, ids)
    return allocator.match_window(hashes, ids, window, null)


def commit_blocks(allocator: CachingBlockAllocator, request) -> None:
    """Register the blocks this step fills: every full block below ``num_computed_tokens``
    (and below its tokens: proposals are not committed) that the map does not know yet (one
    hash each, computed once)."""
    bs, done, ids = allocator.block_size, request.num_cached_blocks, request.token_ids
    # never past its own tokens: a verify step's proposals are computed, not yet verified
    full = min(request.num_computed_tokens, len(ids)) // bs
    if full <= done:
        return
    if len(request.block_hashes) < full:
        request.block_hashes = block_hashes(ids[:full * bs], bs, request.block_hashes)
    allocator.register(request.blocks[done:full], request.block_hashes[done:full],
                       ids[done * bs:full * bs])
    request.num_cached_blocks = full
