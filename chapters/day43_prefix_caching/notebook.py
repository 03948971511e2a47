# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Day 43 notebook: prefix caching, by hand and in the engine
#
# On a CPU, in well under a minute, with the live `nanoserve` package and the shipped
# nanoserve-tiny model (float32, greedy):
#
# 1. the chained hash: full blocks only, each block named by everything before it;
# 2. the pool by hand: register, free, hit, reference counts, the eviction queue;
# 3. the burst: eight requests behind one 480-token system prompt, caching off and on;
# 4. identical prompts on both sides of a block boundary: the last token is always computed;
# 5. requests admitted in one step share what the first of them is about to compute;
# 6. the mixed workload (chunked prefill, preemption, aborts): on against off.

# %%
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day43_prefix_caching.claims import (
    burst_prompts,
    greedy,
    ids,
    llm,
    mixed,
    shared_prompts,
)
from nanoserve.engine.prefix_cache import CachingBlockAllocator, block_hashes

torch.set_num_threads(1)  # a small shared CPU: one thread measures with less noise

# %% [markdown]
# ## 1. A block is named by its whole history
#
# `block_hashes` gives one 16-byte blake2b digest per *full* block, each chained on the one
# before. Seven tokens at block_size 3 make two full blocks and a partial one, which gets no
# hash. The same three tokens after a different first block get a different name, because
# their keys and values are different.

# %%
a = block_hashes([1, 2, 3, 4, 5, 6, 7], 3)
b = block_hashes([9, 2, 3, 4, 5, 6], 3)
print(len(a), "hashes for 7 tokens at block_size 3")
print("block 1 after [1, 2, 3]:", a[1].hex())
print("block 1 after [9, 2, 3]:", b[1].hex())
print("extending the known first hash computes only the second:",
      block_hashes([1, 2, 3, 4, 5, 6, 7], 3, a[:1]) == a)

# %% [markdown]
# ## 2. The pool by hand
#
# Eight blocks of two tokens. A request computes `[1..6]` (three full blocks), registers them
# and finishes: the blocks are free *and* still findable. A second request with the same first
# four tokens finds two of them, takes them (one more holder each), and lets go again. A block
# with two holders is held once.

# %%
pool = CachingBlockAllocator(num_blocks=8, block_size=2)
first = [1, 2, 3, 4, 5, 6]
blocks = pool.allocate(3)
pool.register(blocks, block_hashes(first, 2), first)
print("A holds", blocks, "| free", pool.num_free, "held", pool.num_held)
hit = pool.match(block_hashes([1, 2, 3, 4, 9], 2)[:2], [1, 2, 3, 4, 9])
pool.take(hit)
print("B hits", hit, "| free", pool.num_free, "held", pool.num_held, "(shared blocks once)")
pool.free(blocks)
print("A finishes | free", pool.num_free, "held", pool.num_held, "cached", pool.num_cached)
pool.free(hit)
print("B finishes | free", pool.num_free, "held", pool.num_held, "cached", pool.num_cached)
pool.check_invariants()

# %% [markdown]
# Now ask for more blocks than have never been cached. The five never-cached blocks go first;
# then the queue gives up its oldest entry. `free` walks a request's blocks tail first, so the
# tail of A (block 2) is the oldest, and the head B refreshed (blocks 0 and 1) survives.

# %%
got = pool.allocate(6)
print("allocate(6) ->", got, "| evictions", pool.evictions)
print("A's prefix still finds", pool.match(block_hashes(first, 2), first))
pool.free(got)
pool.check_invariants()

# %% [markdown]
# A hash collision costs a miss: the pool compares the token ids of every block it finds.

# %%
fake = pool.allocate(1)
pool.register(fake, [b"the same name"], [7, 7])
pool.free(fake)
print("same name, same tokens:", pool.match([b"the same name"], [7, 7]))
print("same name, other tokens:", pool.match([b"the same name"], [8, 8]))

# %% [markdown]
# ## 3. A burst behind one system prompt
#
# Eight requests, each the same 480-token system prompt and a 16-token question of its own,
# one output token each, so nearly all the work is prefill. The caching engine computes the
# system prompt once.

# %%
for caching in (False, True):
    lm = llm(caching)
    lm.generate(burst_prompts(1), greedy(1))  # a first burst warms the engine up
    t = time.perf_counter()  # the second, on a new system prompt, is timed
    lm.generate(burst_prompts(2), greedy(1))
    wall = time.perf_counter() - t
    s = lm.stats
    print(f"caching {'on ' if caching else 'off'}: tokens computed {s.tokens_computed:5,} "
          f"over both calls, hits {s.prefix_cache_hits:5,} of {s.prefix_cache_queries:5,} "
          f"looked up; second burst {wall * 1e3:.0f} ms")

# %% [markdown]
# ## 4. Identical prompts and the block boundary
#
# The first output token comes from the last prompt token's logits, so a hit stops before it,
# on a block boundary. A repeated 48-token prompt at block_size 16 recomputes its whole last
# block; one token more and the repeat computes a single token.

# %%
for n in (16, 17, 47, 48, 49, 64, 65):
    lm = llm(True)
    prompt = ids(n, n)
    lm.generate([prompt], greedy(1))
    before = lm.stats.tokens_computed
    lm.generate([prompt], greedy(1))
    print(f"{n:3d}-token prompt, repeated: {lm.stats.tokens_computed - before:2d} computed, "
          f"{(n - 1) // 16 * 16:2d} cached")

# %% [markdown]
# ## 5. Admitted in one step, shared in one step
#
# Six 56-token prompts sharing their first 48 tokens, added together. The scheduler registers
# the first request's blocks the moment it is admitted, before its forward runs; the five
# after it hit them in the same step. After the step the pool holds each shared block once.

# %%
for caching in (False, True):
    lm = llm(caching)
    core, pool = lm.core, lm.core.scheduler.kv_cache_manager
    reqs = [core.add_request(f"s{i}", p, greedy(9)) for i, p in enumerate(shared_prompts())]
    core.step()
    print(f"caching {'on ' if caching else 'off'}: admitted {core.scheduler.admitted_total}, "
          f"hit {core.scheduler.prefix_cache_hits}, blocks held {pool.num_held}; tables "
          f"{[r.blocks for r in reqs[:3]]} ...")
    while core.has_unfinished():
        core.step()
    core.check_drained()
    print(f"   after the drain: {pool.num_free} of {pool.num_blocks} free, "
          f"{getattr(pool, 'num_cached', 0)} cached")

# %% [markdown]
# ## 6. The mixed workload: on against off
#
# Sixteen requests behind two shared heads, added one per step into a 40-block pool under a
# 32-token budget; the pool runs dry, requests are preempted and resume; two are aborted once
# they hold 3 and 1 tokens. The tokens agree; the logprobs differ in the last few bits; and the
# resumed requests find their own history cached.

# %%
on, off = mixed(True), mixed(False)
same = sum(on["tokens"][k] == off["tokens"][k] for k in on["tokens"])
gap = max(abs(x - y) for k in on["logprobs"]
          for x, y in zip(on["logprobs"][k], off["logprobs"][k], strict=True))
print(f"{same} of {len(on['tokens'])} requests identical; largest logprob gap {gap:.1e}")
for name, r in (("off", off), ("on ", on)):
    print(f"caching {name}: {r['preemptions']} preemptions, {r['recomputed']:,} tokens "
          f"recomputed; after the drain {r['free']} of {r['blocks']} free, {r['cached']} "
          f"cached, usage {r['usage']:.0%}")
