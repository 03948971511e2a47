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
# # Day 44 notebook: counting the prefix cache, predicted and then read
#
# On a CPU, in well under a minute, with the live `nanoserve` package and the shipped
# nanoserve-tiny model (float32, greedy, EOS ignored):
#
# 1. the formula, worked for the chapter's five cases before anything runs;
# 2. a real `nanoserve serve --enable-prefix-caching`: case A through the official `openai`
#    client, one request after another, `/metrics` scraped after every request;
# 3. the same case in process, read from `llm.stats`;
# 4. evictions through a small pool, predicted and counted;
# 5. what preemption does to the counters: nothing.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day44_prefix_counting.claims import (
    CASES,
    EVICT_B,
    EVICT_G,
    EVICT_K,
    EVICT_L,
    EVICT_N,
    MAX_TOKENS,
    case_prompts,
    evict_prompts,
    greedy,
    scrape,
)
from chapters.day44_prefix_counting.snapshot.counting import (
    expected_evictions,
    expected_hits,
    expected_queries,
    hit_rate,
)
from nanoserve import LLM
from nanoserve.bench.local_server import local_server
from nanoserve.config import DEFAULT_MODEL

torch.set_num_threads(1)  # a small shared CPU: one thread is plenty for this model

# %% [markdown]
# ## 1. The known answer, first
#
# N requests of L prompt tokens share their first P tokens and arrive one after another at
# block size B. The first hits nothing; each later one hits the blocks inside the prefix and
# before its own last token: `B * floor(min(P, L - 1) / B)` tokens.

# %%
for name, (n, length, prefix, bs) in CASES.items():
    h, q = expected_hits(n, length, prefix, bs), expected_queries(n, length)
    print(f"case {name}: N {n}, L {length:3d}, P {prefix:3d}, B {bs:2d} -> hits {h:4,} of "
          f"{q:5,} queries ({hit_rate(h, q):.1%}); naive (N - 1) * P = {(n - 1) * prefix:,}")

# %% [markdown]
# ## 2. Over HTTP: a real server, the `openai` client, `/metrics`
#
# The server is a child process on a free port of 127.0.0.1; `local_server` waits for
# `/health` and stops it afterwards. Its counters do not start at zero: the server's own
# warm-up request (one token) was looked up too. Every reading below is an increase.

# %%
import openai  # noqa: E402

with local_server(DEFAULT_MODEL, dtype="float32",
                  extra_args=("--enable-prefix-caching", "--block-size", "16")) as server:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           timeout=120)
    model = client.models.list().data[0].id
    start = scrape(server.url)
    print("fresh server:", {k: v for k, v in start.items()})
    n, length, prefix, bs = CASES["A"]
    for i, prompt in enumerate(case_prompts("A")):
        client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                  temperature=0, extra_body={"ignore_eos": True})
        now = scrape(server.url)
        hits = now["prefix_cache_hits"] - start["prefix_cache_hits"]
        queries = now["prefix_cache_queries"] - start["prefix_cache_queries"]
        print(f"after request {i + 1}: hits {hits:5.0f} of {queries:5.0f} "
              f"(formula {expected_hits(i + 1, length, prefix, bs):4d} of "
              f"{expected_queries(i + 1, length):4d}), KV usage {now['kv_cache_usage_perc']:.2f}")

# %% [markdown]
# ## 3. In process: `llm.stats`
#
# The same prompts through `LLM`, one `generate` call each. `llm.stats` adds up the increase
# of the scheduler's and the pool's counters over every call: the same numbers `/metrics`
# reads, because both read the same counters.

# %%
for name, (n, length, prefix, bs) in CASES.items():
    llm = LLM(SHIPPED, dtype="float32", block_size=bs, enable_prefix_caching=True)
    per_request = []
    for prompt in case_prompts(name):
        before = llm.stats.prefix_cache_hits
        llm.generate([prompt], greedy())
        per_request.append(llm.stats.prefix_cache_hits - before)
    s = llm.stats
    print(f"case {name}: hits {s.prefix_cache_hits:4,} of {s.prefix_cache_queries:5,} "
          f"(formula {expected_hits(n, length, prefix, bs):4,}); per request {per_request}")

# %% [markdown]
# ## 4. Evictions
#
# Six unrelated 40-token prompts, 9 output tokens each (48 tokens computed: three full blocks),
# through an 8-block pool. Once the 8 never-cached blocks are used, every new block evicts the
# least recently freed cached one.

# %%
llm = LLM(SHIPPED, dtype="float32", block_size=EVICT_B, num_kv_blocks=EVICT_K,
          enable_prefix_caching=True)
for i, prompt in enumerate(evict_prompts()):
    llm.generate([prompt], greedy(EVICT_G))
    pool = llm.core.scheduler.kv_cache_manager
    print(f"after request {i + 1}: evicted {llm.stats.prefix_cache_evictions:2d} (formula "
          f"{expected_evictions(i + 1, EVICT_L, EVICT_G, EVICT_B, EVICT_K):2d}), cached "
          f"{pool.num_cached}, free {pool.num_free} of {pool.num_blocks}")
assert EVICT_N == i + 1

# %% [markdown]
# ## 5. A resumed request is not counted again
#
# A request preempted by recompute is admitted again later and looks the cache up again, for
# its prompt and its output so far. As in vLLM, only a new request's lookup is counted. Day
# 43's mixed prompts go through its cramped pool in one `generate` call: requests are
# preempted, and still the prompt tokens looked up equal the prompt tokens sent.

# %%
from chapters.day44_prefix_counting.claims import preempted_lookups  # noqa: E402

queries, sent, preemptions = preempted_lookups()
print(f"{preemptions} preemptions: {queries:,} prompt tokens looked up for {sent:,} sent "
      f"(equal: {queries == sent})")
