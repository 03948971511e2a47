# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 45 notebook: what prefix caching buys, measured
#
# Day 43 made full KV blocks findable again by a chained hash of their tokens, and Day 44 put
# the cache's queries and hits on `/metrics`. Here the cache is measured from outside, over
# HTTP, on a CPU in about a minute:
#
# 1. vLLM's `prefix_repetition` workload, and the hits it determines before anything runs;
# 2. one run against `nanoserve serve` with caching off and on: what `/metrics` counted, and
#    whether the text changed;
# 3. one timed round at rate 4 and rate inf;
# 4. the peer run against vLLM's CPU build, if `make bench-peers` has recorded one.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import json
import math

from chapters.common import hardware
from chapters.day42_budget_measured.arms import measure
from chapters.day45_prefix_measured import claims
from chapters.day45_prefix_measured.snapshot.workload import cached_tokens

print(hardware())

# %% [markdown]
# ## 1. The workload and what it determines
#
# 16 requests, seed 0: 4 random prefixes of 512 ids, each shared by 4 requests that add their
# own 32-id suffix, shuffled, 16 tokens out each. A full-block cache with block_size 16 can give
# a request at most `(544 - 1) // 16 = 33` blocks. In each group the first request to arrive
# misses the prefix and the other three find its 32 blocks. The benchmark's probe request sends
# the first request's prompt before the timed ones, so that group has no miss at all.

# %%
reqs = claims.workload()
prompts = [r.prompt for r in reqs]
print(claims.workload_counts(), "| package generator vs frozen:", claims.frozen_matches())
for bs in (16, 32, 128):
    print(f"block_size {bs:3d}: {cached_tokens(prompts, bs, warm=[prompts[0]]):,} of "
          f"{sum(map(len, prompts)):,} prompt tokens found cached")

# %% [markdown]
# ## 2. What the servers counted
#
# One `nanoserve serve` with caching off and one with it on (nanoserve-tiny, float32, 8
# slots), the workload at rate inf. `bench serve` reads each server's `/metrics` before and
# after the run; the difference is the run's own queries and hits.

# %%
for arm, m in claims.counted().items():
    print(f"{arm:>3}: {m['completed']} completed, {m['failed']} failed, "
          f"{m['total_output_tokens']} tokens out; server counters {m['server_counters']}")
print("prompt tokens computed (off, on):", claims.both(claims.computed),
      "| texts that differ:", claims.texts_differ())

# %% [markdown]
# ## 3. One timed round
#
# Rate 4 (Poisson) shows a request's own prefill, with little queueing. Rate inf shows a full
# batch, where each prefill step that caching saves also shortens the queue behind it. Each run
# uses fresh prefixes, so neither finds the other's blocks.

# %%
(round0,) = measure(claims.ARMS, 1, claims._bench(lambda r: [(4.0, 11), (math.inf, 12)]))
print(f"{'':34s}{'off':>10s}{'on':>10s}")
for label, i, key in (("median TTFT, rate 4 (ms)", 0, "median_ttft_ms"),
                      ("median TTFT, rate inf (ms)", 1, "median_ttft_ms"),
                      ("p99 TTFT, rate inf (ms)", 1, "p99_ttft_ms"),
                      ("output tok/s, rate inf", 1, "output_throughput"),
                      ("median ITL, rate inf (ms)", 1, "median_itl_ms")):
    print(f"{label:34s}" + "".join(f"{round0[a][i][key]:10.1f}" for a in ("off", "on")))

# %% [markdown]
# ## 4. The peer, vLLM's CPU build
#
# `make bench-peers` runs `peers.py`: vLLM 0.32's OpenAI server and `nanoserve serve`, caching
# on and off, all at block_size 32, the same workload, five interleaved rounds. Its results
# file is what the chapter's recorded rows read.

# %%
peers = ROOT / "chapters" / "day45_prefix_measured" / "results" / claims.PEERS
if peers.is_file():
    data = json.loads(peers.read_text())
    print(data["machine"], data["date"])
    print(json.dumps(data["values"], indent=1))
else:
    print("no recorded peer run; make bench-peers writes", peers)
