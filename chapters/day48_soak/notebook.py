# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 48 notebook: a small soak, and the rule that judges it
#
# `run_soak` starts `nanoserve serve` (nanoserve-tiny, float32, 8 slots) as a subprocess on a
# free port of 127.0.0.1, sends a seeded mix of requests from many clients, hangs up on a fifth
# of them, and then checks from outside that nothing leaked, nothing is stuck, every greedy
# answer equals the offline engine's and memory did not grow. The server is stopped when the
# soak ends. On a 2-core CPU in about half a minute:
#
# 1. the seeded mix: what the clients will send;
# 2. a small soak: 60 requests from 12 clients;
# 3. the verdict, live and frozen, and the frozen rule on records with each kind of problem.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import collections

from chapters.common import one_thread
from chapters.day48_soak.snapshot.verdict import problems
from nanoserve.bench.soak import make_jobs, run_soak, verdict

# %% [markdown]
# ## 1. The mix
#
# Each job is one request: streamed or not, greedy or sampled (temperature, `top_p`, `top_k`,
# a seed, sometimes penalties), 1 to 24 tokens, and for about a fifth a client that leaves
# early: a plain request cancelled 0 to 0.3 s after it is sent, a stream abandoned after 0 to
# 4 chunks. Every job here is a completion (`chat=False`): the mix this chapter was recorded with,
# before the shipped model had a chat template.

# %%
jobs = make_jobs(60, seed=48, disconnect_rate=0.2, chat=False)
for j in jobs[:8]:
    leave = (f"leaves after {j.hang_up_chunks} chunks" if j.hang_up_chunks is not None else
             f"hangs up after {j.hang_up_after:.2f} s" if j.hang_up_after is not None else
             "reads to the end")
    print(f"{j.index:3} {'stream' if j.stream else 'plain ':6} "
          f"{'greedy ' if j.greedy else 'sampled'} {j.max_tokens:2} tokens  {leave:26} "
          f"{j.prompt!r}")
print(collections.Counter(("stream" if j.stream else "plain",
                           "hang-up" if j.hang_up_after is not None or j.hang_up_chunks
                           is not None else "to the end") for j in jobs))

# %% [markdown]
# ## 2. A small soak
#
# 60 requests from 12 clients. Afterwards the soak reads `/metrics` until running, waiting
# and KV usage are all 0 (at most 5 s), reads the server's RSS from `/proc`, and replays every
# completed greedy job through the offline engine. (A run this short has its first memory
# reading at its last response, so its RSS growth says little; the long run's first reading
# is at the 1,000th.)

# %%
with one_thread():  # the offline reference runs in this process
    s = run_soak(requests=60, concurrency=12, disconnect_rate=0.2, seed=48,
                 show_progress=False, chat=False)
for key in ("requests", "completed", "disconnected", "failed", "streamed", "greedy_completed",
            "mismatches", "leaked_blocks_frac", "running_at_end", "waiting_at_end",
            "stuck_requests", "settled_within_s", "rss_after_1000_mb", "rss_end_mb",
            "rss_growth", "wall_s"):
    print(f"{key:20} {s[key]}")

# %% [markdown]
# ## 3. The verdict
#
# The live `verdict` and the frozen `problems` are the same rule; an empty list is a pass.
# Then the frozen rule on records that each break one check.

# %%
print("live verdict:  ", verdict(s))
print("frozen verdict:", problems(s))
good = {k: s[k] for k in ("failed", "mismatches", "stuck_requests", "settled_within_s",
                          "leaked_blocks_frac", "rss_growth")}
for change in ({"failed": 3}, {"mismatches": 1}, {"stuck_requests": 2, "settled_within_s": None},
               {"leaked_blocks_frac": 0.125}, {"rss_growth": 0.31}):
    print(f"{str(change):50} -> {problems(good | change)}")
