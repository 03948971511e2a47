"""The live prefix-caching pool held against the frozen Day 43 snapshot: the same answers to the
same seeded random sequences of allocate / match / take / register / free / forget calls (and of
calls both must refuse), the same hashes, the same eviction order, and the same request-level
matching and registration."""

from __future__ import annotations

import random

import pytest

import nanoserve.engine.prefix_cache as live
from chapters.day43_prefix_caching.claims import eviction_order, random_ops
from chapters.day43_prefix_caching.snapshot import prefix_cache as snap


@pytest.mark.parametrize("seed,num_blocks,block_size", [
    (0, 6, 1), (1, 12, 2), (2, 24, 4), (3, 8, 3), (4, 40, 2),
])
def test_random_operation_sequences_agree(seed, num_blocks, block_size):
    a = random_ops(live, seed=seed, n=1500, num_blocks=num_blocks, block_size=block_size)
    b = random_ops(snap, seed=seed, n=1500, num_blocks=num_blocks, block_size=block_size)
    assert a == b
    kinds = {entry[0][0] for entry in a}
    assert {"admit", "free", "refused"} <= kinds  # the sequence exercises the interface
    assert any(entry[0][0] == "admit" and entry[0][1] for entry in a)  # hits happen
    assert a[-1][4] > 0  # and evictions


def test_hashes_agree():
    rng = random.Random(43)
    for _ in range(50):
        ids = [rng.randrange(4096) for _ in range(rng.randint(0, 90))]
        bs = rng.choice([1, 4, 16])
        assert live.block_hashes(ids, bs) == snap.block_hashes(ids, bs)
        k = rng.randint(0, len(ids) // bs)
        assert live.block_hashes(ids, bs, snap.block_hashes(ids[:k * bs], bs)) == \
            snap.block_hashes(ids, bs)
    assert live.ROOT_HASH == snap.ROOT_HASH


def test_eviction_order_agrees():
    assert eviction_order(live) == eviction_order(snap) == "5, 2, 3, 4; finds 0, 1"


class _Req:
    def __init__(self, token_ids):
        self.token_ids = token_ids
        self.blocks, self.block_hashes = [], []
        self.num_computed_tokens = self.num_cached_blocks = 0


def _admit_all(module, prompts, block_size):
    pool = module.CachingBlockAllocator(32, block_size)
    seen = []
    for p in prompts:
        r = _Req(p)
        hit = module.match_prefix(pool, r)
        pool.take(hit)
        r.blocks = hit + pool.allocate(pool.blocks_for_length(len(p)) - len(hit))
        r.num_computed_tokens, r.num_cached_blocks = len(p), len(hit)
        module.commit_blocks(pool, r)
        seen.append((hit, list(r.blocks), r.num_cached_blocks, pool.num_cached))
        pool.check_invariants()
    return seen


def test_request_matching_and_registration_agree():
    head = list(range(100, 117))
    prompts = [head + [1, 2, 3], head + [4, 5], head[:9] + [6] * 7, head + [1, 2, 3], head[:4]]
    for bs in (1, 4, 8):
        got = _admit_all(live, prompts, bs)
        assert got == _admit_all(snap, prompts, bs)
        assert got[1][0] == got[0][1][:len(head) // bs]  # the second hits the shared head
        assert len(got[3][0]) == (len(prompts[3]) - 1) // bs  # identical: all but the last token
