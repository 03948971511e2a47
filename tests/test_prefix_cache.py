"""Prefix caching (Day 43) against the engine without it, and the pool's books after every drain.

The text never changes: greedy outputs in float32 are identical with caching on and off, on
workloads with shared prefixes, a burst admitted in one step, preemption, aborts and a failed
step. The counts have a known answer: N requests of L prompt tokens sharing a P-token prefix,
arriving one after another at block size B, hit (N - 1) * B * floor(min(P, L - 1) / B) tokens.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoserve import LLM, SamplingParams
from nanoserve.engine.prefix_cache import CachingBlockAllocator, block_hashes

GREEDY = SamplingParams(max_tokens=8, temperature=0)


def shared(n: int, prefix: int, total: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``total`` tokens, the first ``prefix`` of them common to all."""
    head = [1] + [10 + (3 * j + seed) % 150 for j in range(prefix - 1)]
    return [head + [200 + (i * 7 + j) % 50 for j in range(total - prefix)] for i in range(n)]


def texts(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    out = [o.token_ids for o in llm.generate(prompts, params)]
    llm.core.check_drained()
    llm.core.scheduler.kv_cache_manager.check_invariants()
    return out


# ---------------------------------------------------------------------------- the pool

def test_hashes_are_the_same_in_another_process():
    ids = list(range(1, 40))
    code = ("from nanoserve.engine.prefix_cache import block_hashes; "
            f"print([h.hex() for h in block_hashes({ids}, 8)])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout.strip()
    assert other == str([h.hex() for h in block_hashes(ids, 8)])


def test_hashes_are_chained_and_full_blocks_only():
    a, b = block_hashes([1, 2, 3, 4, 5, 6, 7], 3), block_hashes([9, 2, 3, 4, 5, 6], 3)
    assert len(a) == 2 and len(b) == 2  # the 7th token is not a full block
    assert a[1] != b[1]  # the same second block after a different first one
    assert block_hashes([1, 2, 3, 4, 5, 6, 7], 3, a[:1]) == a  # extending costs new blocks only


def test_a_hash_collision_is_a_miss_not_wrong_kv(monkeypatch):
    pool = CachingBlockAllocator(8, 2)
    blocks = pool.allocate(1)
    pool.register(blocks, [b"same"], [1, 2])
    pool.free(blocks)
    assert pool.match([b"same"], [1, 2]) == blocks
    assert pool.match([b"same"], [3, 4]) == []  # another block's tokens under the same hash


def test_shared_blocks_are_counted_once_and_freed_by_their_last_holder():
    pool = CachingBlockAllocator(4, 2)
    ids = [1, 2, 3, 4]
    hashes = block_hashes(ids, 2)
    blocks = pool.allocate(2)
    pool.register(blocks, hashes, ids)
    hit = pool.match(hashes, ids)
    assert pool.free_cost(hit) == 0  # held already: taking them costs no free block
    pool.take(hit)
    pool.free(blocks)
    assert pool.num_free == 2 and pool.num_held == 2  # the second holder still has them
    pool.free(hit)
    assert pool.num_free == 4 and pool.num_cached == 2  # free, and still findable
    pool.check_invariants()
    with pytest.raises(ValueError, match="double free"):
        pool.free(hit)


def test_eviction_takes_never_cached_blocks_first_then_the_oldest_freed():
    pool = CachingBlockAllocator(4, 1)
    first, second = pool.allocate(1), pool.allocate(1)
    pool.register(first, [b"a"], [1])
    pool.register(second, [b"b"], [2])
    pool.free(first)
    pool.free(second)
    assert pool.allocate(2) == [2, 3] and pool.evictions == 0  # the never-cached two
    assert pool.allocate(1) == first and pool.evictions == 1  # then the least recently freed
    assert pool.match([b"a"], [1]) == [] and pool.match([b"b"], [2]) == second
    pool.check_invariants()


# ---------------------------------------------------------------------------- the engine

@pytest.mark.parametrize("n,prefix,total,block_size", [
    (4, 32, 40, 16),  # the prefix is two whole blocks
    (5, 30, 40, 8),  # it ends inside a block: that block is not shared
    (3, 40, 40, 16),  # identical prompts: the last token is always computed
    (6, 17, 23, 4),
])
def test_one_after_another_hits_the_known_count(n, prefix, total, block_size):
    llm = LLM(dtype="float32", enable_prefix_caching=True, block_size=block_size)
    prompts = shared(n, prefix, total)
    ref = LLM(dtype="float32", block_size=block_size)
    for p in prompts:  # one after another: each request alone in the engine
        assert texts(llm, [p]) == texts(ref, [p])
    want = (n - 1) * block_size * (min(prefix, total - 1) // block_size)
    s = llm.core.scheduler
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (n * total, want)


def test_a_burst_admitted_in_one_step_shares_its_prefix():
    prompts = shared(6, 48, 56)
    llm = LLM(dtype="float32", enable_prefix_caching=True, max_num_seqs=8)
    got = texts(llm, prompts)
    assert got == texts(LLM(dtype="float32", max_num_seqs=8), prompts)
    assert llm.core.scheduler.admitted_total == 6
    assert llm.core.scheduler.prefix_cache_hits == 5 * 48  # each later one, the same step


def test_cached_blocks_with_no_holder_count_as_free():
    llm = LLM(dtype="float32", enable_prefix_caching=True)
    texts(llm, shared(3, 32, 40))
    snap = llm.core.snapshot()
    assert snap.num_free_blocks == snap.num_blocks and snap.kv_cache_usage == 0.0
    assert llm.core.scheduler.kv_cache_manager.num_cached > 0  # ... while they are still findable


def test_preempted_requests_keep_their_blocks_cached_and_their_text():
    prompts = shared(6, 40, 60)
    kw = dict(dtype="float32", block_size=4, num_kv_blocks=40, max_num_seqs=4,
              max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    llm = LLM(enable_prefix_caching=True, **kw)
    got = texts(llm, prompts, params)
    assert llm.core.scheduler.preemptions > 0
    assert got == texts(LLM(**kw), prompts, params)


def test_a_failed_step_forgets_the_blocks_it_never_wrote():
    prompts = shared(2, 32, 40)
    llm = LLM(dtype="float32", enable_prefix_caching=True, fail_on_step=(1,))
    core = llm.core
    for i, p in enumerate(prompts):
        core.add_request(str(i), p, GREEDY)
    deltas = core.step()  # the forward raises: both fail, nothing they registered survives
    assert {d.finish_reason for d in deltas} == {"error"}
    core.check_drained()
    assert core.scheduler.kv_cache_manager.num_cached == 0
    assert texts(llm, prompts) == texts(LLM(dtype="float32"), prompts)


def test_an_abort_mid_prefill_gives_every_block_back():
    llm = LLM(dtype="float32", enable_prefix_caching=True, max_num_batched_tokens=8,
              block_size=4)
    core = llm.core
    texts(llm, shared(1, 32, 40))  # warm the cache
    core.add_request("x", shared(1, 32, 100)[0], GREEDY)
    core.step()
    assert core.abort_request("x")
    core.step()
    core.check_drained()
    core.scheduler.kv_cache_manager.check_invariants()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 4, 16]), prefix=st.integers(1, 40),
       extra=st.integers(0, 12), n=st.integers(1, 5), budget=st.sampled_from([None, 5, 16]),
       seed=st.integers(0, 3))
def test_random_prefix_overlaps_never_change_the_text(block_size, prefix, extra, n, budget,
                                                      seed):
    prompts = shared(n, prefix, prefix + extra, seed)
    kw = dict(dtype="float32", block_size=block_size, max_num_seqs=4,
              max_num_batched_tokens=budget)
    params = SamplingParams(max_tokens=5, temperature=0)
    on = LLM(enable_prefix_caching=True, **kw)
    first, again = texts(on, prompts, params), texts(on, prompts[::-1], params)
    off = LLM(**kw)
    assert first == texts(off, prompts, params) and again == first[::-1]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_block_filled_by_a_decode_is_shared_only_once_written(chunked):
    """Two forwards a step (chunking off) run the prefill before the decode: a newcomer that
    continues a running request's tokens must not hit the block that decode is filling."""
    def newcomer_text(caching: bool) -> list[int]:
        llm = LLM(dtype="float32", block_size=4, enable_prefix_caching=caching,
                  enable_chunked_prefill=chunked)
        core = llm.core
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        r = core.add_request("r", [1, 5, 77, 300, 12, 901], params)
        while len(r.output_token_ids) < 2:
            core.step()
        n = core.add_request("n", r.token_ids[:8] + [44, 45], params)  # 8 = two full blocks
        while core.has_unfinished():
            core.step()
        core.check_drained()
        return n.output_token_ids

    assert newcomer_text(True) == newcomer_text(False)
