"""The live engine's prefix-cache counters held against the Day 44 snapshot's closed forms, on
seeded random workloads: N requests of L tokens sharing exactly P, one after another, at block
size B (hits and queries), and unrelated requests that fill whole blocks through a small pool
(evictions)."""

from __future__ import annotations

import random

import pytest

from chapters.common import SHIPPED, one_thread
from chapters.day44_prefix_counting.snapshot.counting import (
    expected_evictions,
    expected_hits,
    expected_queries,
)
from nanoserve import LLM, SamplingParams


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2, 2048) for _ in range(n)]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize("seed", range(6))
def test_hits_and_queries_follow_the_formula(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8, 16])
    n, length = rng.randint(1, 5), rng.randint(2, 60)
    prefix = rng.choice([length, rng.randint(1, length)])  # BOS is always shared
    shared = [0] + _ids(rng, prefix - 1)
    prompts = [shared + ([2 + i] + _ids(rng, length - prefix - 1) if prefix < length else [])
               for i in range(n)]  # each tail starts with its own token: exactly P shared
    llm = LLM(SHIPPED, dtype="float32", block_size=bs, enable_prefix_caching=True)
    for p in prompts:
        llm.generate([p], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    s = llm.stats
    assert (s.prefix_cache_hits, s.prefix_cache_queries) == (
        expected_hits(n, length, prefix, bs), expected_queries(n, length))
    assert s.prefix_cache_evictions == 0


@pytest.mark.parametrize("n,length,gen,bs,blocks", [(6, 40, 9, 16, 8), (5, 7, 2, 4, 6),
                                                    (3, 30, 3, 8, 12)])
def test_evictions_follow_the_formula(n, length, gen, bs, blocks):
    rng = random.Random(n * length)
    llm = LLM(SHIPPED, dtype="float32", block_size=bs, num_kv_blocks=blocks,
              enable_prefix_caching=True)
    for _ in range(n):
        llm.generate([[0] + _ids(rng, length - 1)],
                     SamplingParams(max_tokens=gen, temperature=0, ignore_eos=True))
    assert llm.stats.prefix_cache_evictions == expected_evictions(n, length, gen, bs, blocks)
    assert llm.stats.prefix_cache_hits == 0
    assert llm.core.snapshot().kv_cache_usage == 0.0
