"""Blocks behind a sliding window go back to the pool while their request runs (Day 70).

A random ``MistralForCausalLM`` (every layer windowed, 12 tokens) in blocks of 4: prompts of 5
to 30 tokens and up to 24 new ones cross the window many times. On the reference and gathered
backends, in float32 and greedy, the text equals the uncached forward's (no pool at all) with
whole prompts, chunked prefill, a cramped pool that preempts, compaction, static waves and prefix
caching, blocks were given back in every run, the null block was never written, and after the
drain every block is back. The bench's count (``nanoserve.bench.window_pool``) shows the peak a
long generation holds falling to the window's blocks, with identical text. The KV manager's and
the prefix cache's rules are held on their own too.
"""

from __future__ import annotations

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.bench.window_pool import measure
from nanoserve.engine.kv_manager import NULL_BLOCK, KVCacheManager, freeing_window
from nanoserve.engine.prefix_cache import CachingBlockAllocator, block_hashes
from nanoserve.engine.request import Request

WINDOW, BS = 12, 4
KW = dict(dtype="float32", skip_tokenizer_init=True, kernels=False, block_size=BS)
_g = torch.Generator().manual_seed(1)
PROMPTS = [torch.randint(1, 255, (n,), generator=_g).tolist() for n in (5, 21, 13, 30)]
PARAMS = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (24, 10, 24, 16)]
PATHS = {
    "whole": {},
    "chunked": dict(max_num_batched_tokens=8, max_num_seqs=4),
    "preempted": dict(num_kv_blocks=13, max_num_seqs=4, max_num_batched_tokens=8),
    "compacted": dict(compact_rows=True, max_num_seqs=4),
    "static": dict(batching="static", max_num_seqs=4),
}


@pytest.fixture(scope="module")
def ckpt(hf_checkpoint):
    return hf_checkpoint("gqa", family="mistral", sliding_window=WINDOW)


def uncached(path, prompts, params):
    llm = LLM(str(path), **KW, enable_kv_cache=False)
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def expected(ckpt):
    return uncached(ckpt, PROMPTS, PARAMS)


def check_after(llm) -> None:
    """Every block back, the null block never written (it holds the cache's zeros)."""
    core = llm.core
    core.check_drained()
    cache = core.engine.cache
    null = slice(NULL_BLOCK * BS, (NULL_BLOCK + 1) * BS)
    assert not cache.k[:, null].any() and not cache.v[:, null].any()


@pytest.mark.parametrize("attention", ["reference", "gathered"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_text_is_the_uncached_forwards(ckpt, expected, attention, path):
    llm = LLM(str(ckpt), **KW, attention=attention, **PATHS[path])
    got = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert got == expected
    sched, kv = llm.core.scheduler, llm.core.scheduler.kv_cache_manager
    assert kv.window == WINDOW and kv.num_blocks == kv.pool.num_blocks - 1
    assert kv.window_freed > 0
    if path == "preempted":
        assert sched.preemptions > 0
    if path == "compacted":
        assert sched.compactor.moves > 0
    check_after(llm)


@pytest.mark.parametrize("attention", ["reference", "gathered"])
def test_a_prefix_longer_than_the_window_hits_without_its_head(ckpt, attention):
    """A 28-token shared prefix (7 blocks, the window 12 tokens): the first request's blocks
    go back cached as it runs; the next two hit them, then two more hit after the prefix's
    first two blocks were evicted, since only the blocks inside the window are needed."""
    prefix = torch.randint(1, 255, (28,), generator=torch.Generator().manual_seed(7)).tolist()
    first = [prefix + [3, 4, 5]]
    later = [prefix + [9, 8, 7, 6], prefix + [11, 12, 13, 14, 15]]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = uncached(ckpt, first + later + later, sp)
    llm = LLM(str(ckpt), **KW, attention=attention, enable_prefix_caching=True, max_num_seqs=4)
    got = [o.token_ids for o in llm.generate(first, sp)]
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.window_freed > 0 and kv.num_cached >= 7
    got += [o.token_ids for o in llm.generate(later, sp)]
    hits = kv.prefix_cache_hits
    assert hits >= 2 * 24
    head = [kv.pool._by_hash[h] for h in block_hashes(prefix, BS)[:2]]
    kv.pool.forget(head)  # the prefix's first two blocks evicted
    got += [o.token_ids for o in llm.generate(later, sp)]
    assert kv.prefix_cache_hits - hits >= 2 * 24
    assert got == want
    check_after(llm)


def test_the_null_block_is_read_masked_never_live(ckpt, expected):
    """The reference rectangle gathers the null block's cells for positions behind the
    window: any finite value there changes nothing (weight 0), a NaN would poison the row,
    which is why the placeholder is a block nobody writes."""
    params = PARAMS[3:]
    llm = LLM(str(ckpt), **KW, attention="reference")
    cells = slice(NULL_BLOCK * BS, (NULL_BLOCK + 1) * BS)
    cache = llm.core.engine.cache
    cache.k[:, cells], cache.v[:, cells] = 1e4, -1e4
    assert [o.token_ids for o in llm.generate(PROMPTS[3:], params)] == expected[3:]
    cache.k[:, cells] = float("nan")
    assert [o.token_ids for o in llm.generate(PROMPTS[3:], params)] != expected[3:]


def test_peak_blocks_fall_to_the_window(ckpt):
    """8 + 56 tokens in blocks of 4, a window of 12: every block kept is 16 at the end; given
    back, at most ceil(11 / 4) + 1 = 4 are held at once, and the text is the same."""
    out = measure(prompt_len=8, max_tokens=56, block_size=BS, window=WINDOW, path=ckpt)
    assert out["identical_text"] and out["tokens"] == 56
    assert out["peak_blocks_keeping"] == 16
    assert out["peak_blocks_freeing"] == 4
    # the last query, at position 62, sees 51..62: blocks 12 to 15 stay, 0 to 11 went back
    assert out["blocks_given_back"] == 12


# ---------------------------------------------------------------------------- the rules alone

def test_a_global_layer_keeps_every_block():
    assert freeing_window((4, 6)) == 6 and freeing_window((4, None)) is None
    assert freeing_window(()) is None
    kv = KVCacheManager(8, 4, windows=(4, None))
    assert kv.window is None and kv.num_blocks == 8 and kv.null_block is None
    r = Request(0, list(range(20)), max_tokens=4)
    r.blocks, r.num_computed_tokens = kv.allocate(5), 20
    assert kv.free_out_of_window(r) == 0 and kv.num_free == 3


def test_the_manager_gives_back_what_no_query_sees():
    kv = KVCacheManager(8, 4, windows=(4, 6))
    assert (kv.window, kv.null_block, kv.num_blocks, kv.num_free) == (6, NULL_BLOCK, 7, 7)
    r = Request(0, list(range(20)), max_tokens=4)
    r.blocks = kv.allocate(5)
    r.num_computed_tokens = 20  # the next query at 20 sees keys 15..20: blocks 3 and 4
    assert kv.free_out_of_window(r) == 3
    assert r.blocks[:3] == [NULL_BLOCK] * 3 and r.num_null_blocks == 3 and kv.num_free == 5
    assert kv.free_out_of_window(r) == 0  # nothing twice
    kv.free(r.blocks)
    assert kv.num_free == kv.num_blocks == 7 and kv.usage == 0.0
    kv.check_invariants()


def test_a_window_hit_needs_only_the_blocks_it_reads():
    """Blocks of 2, a window of 3: a hit of 4 blocks computes position 8, which sees 6..8, so
    only block 3 must be cached; the plain rule needs all four."""
    a = CachingBlockAllocator(num_blocks=8, block_size=2)
    ids = list(range(10))
    hashes = block_hashes(ids, 2)[:4]
    blocks = a.allocate(4)
    a.register(blocks, hashes, ids)
    a.free(blocks)
    a.forget(blocks[:2])
    assert a.match(hashes, ids) == []
    assert a.match_window(hashes, ids, 3, -1) == [-1, -1, -1, blocks[3]]
    a.forget(blocks[3:])  # the one block the window needs is gone: the hit shrinks
    assert a.match_window(hashes, ids, 3, -1) == [-1, -1, blocks[2]]
