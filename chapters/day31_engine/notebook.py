# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 31 notebook: the scheduler drives the model
#
# On a CPU, in well under a minute, with the live `nanoserve.LLM` and the shipped
# nanoserve-tiny model:
#
# 1. Day 29's shape run twice, `batching="static"` and the scheduled default, with the engine's
#    counters and every request's finish iteration and timestamps;
# 2. the check that the two policies produce the same tokens;
# 3. one scheduled run stepped by hand, to watch slots, block tables and cache rows change;
# 4. 24 requests, where admissions start landing in the middle of the run;
# 5. the debt the worst-case reservation leaves.

# %%
import pathlib
import statistics
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS
from nanoserve import LLM, SamplingParams
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler
from nanoserve.llm import Stats

# One thread: on a small shared CPU a second OpenMP thread mostly waits for a core, and the
# timings below would measure the neighbours rather than the engine.
torch.set_num_threads(1)
SHIPPED = ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny"

# %% [markdown]
# ## 1. The same shape, static and scheduled
#
# Eight requests with 5-token prompts; seven want 4 tokens and one wants 32. Greedy, with EOS
# ignored, so each request produces exactly `max_tokens` tokens whatever the model says.
# `block_size=4`, eight slots. Each `LLM` runs the shape once to warm up, then its counters are
# reset and the shape is run again.

# %%
params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in DAY29_MAX_TOKENS]


def measured(batching: str):
    llm = LLM(SHIPPED, dtype="float32", block_size=4, max_num_seqs=8, batching=batching,
              enable_chunked_prefill=False)  # this day's steps: a prompt's prefill on its own
    llm.generate(DAY29_PROMPTS, params)  # warm-up
    llm.stats = Stats()
    t0 = time.perf_counter()
    outs = llm.generate(DAY29_PROMPTS, params)
    return llm, outs, time.perf_counter() - t0


runs = {b: measured(b) for b in ("static", "continuous")}
for b, (llm, _, wall) in runs.items():
    s = llm.stats
    print(f"{b:>10}: iterations {s.iterations}, forward passes {s.forward_passes}, "
          f"row-steps {s.row_steps}, tokens {s.generated_tokens}, "
          f"on finished rows {1 - s.generated_tokens / s.row_steps:.1%}, wall {wall * 1e3:.0f} ms")
steps = {b: llm.stats.row_steps for b, (llm, _, _) in runs.items()}
print(f"row-steps, static / scheduled: {steps['static']} / {steps['continuous']} = "
      f"{steps['static'] / steps['continuous']:.1f}x")

# %% [markdown]
# Per request: the iteration of its last token, then the times (from arrival) of its first
# token, its own last token, and the moment it was handed back. The inflation is the last over
# the one before it: how much longer the answer waited than it needed to.

# %%
def table(outs) -> list[float]:
    print(" req  tokens  last token at    first tok  own last tok   handed back  inflation")
    short = []
    for o in outs:
        m = o.metrics
        first, last, back = (t - m.arrival_time for t in (m.first_token_time,
                                                           m.last_token_time, m.finished_time))
        if len(o.token_ids) == 4:
            short.append(back / last)
        print(f"  r{int(o.request_id) % 8}  {len(o.token_ids):6d}  "
              f"iteration {o.finish_iteration:3d}"
              f"  {first * 1e3:8.1f} ms  {last * 1e3:9.1f} ms  {back * 1e3:9.1f} ms"
              f"  {back / last:8.2f}x")
    return short


inflation = {}
for b, (_, outs, _) in runs.items():
    print(f"--- {b}")
    inflation[b] = statistics.median(table(outs))
print(f"\nmedian inflation of the seven short requests: static {inflation['static']:.1f}x, "
      f"scheduled {inflation['continuous']:.2f}x (nanoserve-tiny, 1 thread of this CPU)")
print(f"wall clock for the whole shape, static / scheduled: "
      f"{runs['static'][2] / runs['continuous'][2]:.2f}x")
# Iterations 5 to 32 are 28 decode steps: eight rows each in the static batch, one row (r7)
# in the scheduled loop. r0's and r7's last-token times bracket them.
for b, (_, outs, _) in runs.items():
    step = (outs[7].metrics.last_token_time - outs[0].metrics.last_token_time) / 28
    print(f"{b:>10}: one decode step in iterations 5-32 takes {step * 1e3:.1f} ms")

# %% [markdown]
# The row-steps fall more than fourfold (the ratio printed two cells up), but the wall clock by
# much less. On a small CPU a forward of the tiny model carrying one row costs well over half as
# much as one carrying eight, because much of its time is per-call overhead, not arithmetic; the
# per-step times printed last show how it goes on this machine. The scheduled run still makes 32
# forwards, and 28 of them carry a single row. The latency gain does not depend on that: a
# short answer is handed back by the `schedule()` call right after its last token.
#
# ## 2. Same tokens
#
# Scheduling changes when work happens, never what is computed for a request: each row reads
# only its own cache, so every request must get exactly the tokens the static batch gave it.

# %%
same = [a.token_ids == b.token_ids for a, b in zip(runs["static"][1], runs["continuous"][1],
                                                     strict=True)]
print(f"{sum(same)} of {len(same)} requests have identical tokens")
print("r0:", runs["continuous"][1][0].token_ids, " r7:", runs["continuous"][1][7].token_ids[:8],
      "...")

# %% [markdown]
# ## 3. The loop by hand
#
# `LLM.generate` is this loop: `schedule()`, then `Engine.step(output)`, until nothing is left.
# Building it by hand on the scheduled LLM's engine shows the wiring. The scheduler's
# `on_release` is `engine.release_row`, which resets a cache row before anybody else can land
# on it; `Engine.step` calls `sync_blocks` (a `BlockTable.extend`) so that a row knows the
# blocks its request was given. Three slots and five requests, so rows are reused.

# %%
engine = runs["continuous"][0].engine
sched = Scheduler(KVCacheManager(engine.num_kv_blocks, engine.cache.block_size), 3,
                  on_release=engine.release_row)
wants = [2, 5, 3, 1, 2]
reqs = [Request(i, DAY29_PROMPTS[i], max_tokens=m, params=SamplingParams(temperature=0))
        for i, m in enumerate(wants)]
for r in reqs:
    sched.add(r)


def rows_view() -> str:
    return "  ".join(f"row {row}: len {engine.cache.lengths[row]:2d}, "
                     f"{len(engine.cache.tables[row])} blocks" for row in range(3))


iteration = 0
with torch.inference_mode():
    while True:
        out = sched.schedule()
        if out.finished:
            print(f"  schedule() released {[r.request_id for r in out.finished]} -> {rows_view()}")
        if out.num_scheduled == 0:
            break
        iteration += 1
        done = engine.step(out)
        print(f"iteration {iteration}: prefill {[(r.request_id, r.slot) for r in out.admitted]}"
              f" decode {[(r.request_id, r.slot) for r in out.decode]}"
              f" finished {[r.request_id for r in done]}")
        print(f"  {rows_view()}")
print("tokens:", {r.request_id: r.output_token_ids for r in reqs})
kv = sched.kv_cache_manager
print("every block back in the pool:", kv.num_free == kv.num_blocks)

# %% [markdown]
# A request's cache row is its slot. When r0 is released, row 0 drops to length 0 with no
# blocks before r3 is admitted into it in the same `schedule()` call; the prefill then writes
# r3's prompt into blocks that the row learns about through `sync_blocks`.
#
# ## 4. A queue: 24 requests through 8 slots
#
# Three copies of the shape. Now requests are admitted while others are running, and an
# iteration that has both newcomers and running requests runs two forwards: a padded prefill
# for the newcomers and a batched decode for the rest. `stats.iterations` counts iterations,
# `stats.forward_passes` counts forwards.

# %%
for b, (llm, _, _) in runs.items():
    llm.stats = Stats()
    t0 = time.perf_counter()
    outs = llm.generate(DAY29_PROMPTS * 3, params * 3)
    wall = time.perf_counter() - t0
    s = llm.stats
    print(f"{b:>10}: iterations {s.iterations}, forward passes {s.forward_passes}, "
          f"row-steps {s.row_steps}, tokens {s.generated_tokens}, wall {wall * 1e3:.0f} ms")
    print(f"            finish iterations {[o.finish_iteration for o in outs]}")

# %% [markdown]
# ## 5. The debt: a worst-case reservation
#
# Admission still reserves blocks for prompt plus `max_tokens`, for every request, on day one.
# Here is the pool right after the first iteration of the Day-29 shape: blocks reserved by the
# running requests against the blocks their tokens occupy. With budgets much larger than the
# answers (as with real stop tokens) the gap grows without bound. Closing it means buying
# blocks as tokens arrive, and a way to take blocks back when the pool runs dry.

# %%
sched = Scheduler(KVCacheManager(engine.num_kv_blocks, engine.cache.block_size), 8,
                  on_release=engine.release_row)
reqs = [Request(i, p, max_tokens=m, params=SamplingParams(temperature=0))
        for i, (p, m) in enumerate(zip(DAY29_PROMPTS, DAY29_MAX_TOKENS, strict=True))]
for r in reqs:
    sched.add(r)
with torch.inference_mode():
    engine.step(sched.schedule())
reserved = sum(len(r.blocks) for r in sched.running)
occupied = sum(sched.kv_cache_manager.blocks_for_length(r.num_tokens) for r in sched.running)
print(f"after iteration 1: {reserved} blocks reserved, {occupied} occupied, "
      f"reservation_waste {sched.reservation_waste():.2f}")
for r in list(sched.running):
    sched.abort(r)
sched.schedule()
print("aborted and released; pool whole again:",
      sched.kv_cache_manager.num_free == sched.kv_cache_manager.num_blocks)
