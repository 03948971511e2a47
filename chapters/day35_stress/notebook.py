# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 35 notebook: the stress test, small
#
# On a CPU with the shipped nanoserve-tiny model, in well under a minute:
#
# 1. a 12-request stress run through a 16-block pool, and its report;
# 2. the verdict rule: exact tokens for a finished request, a prefix for an aborted one;
# 3. what the random aborts actually hit;
# 4. the checker against two broken engines: a restart instead of a resume, and a block leak.

# %%
import heapq
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import random
from collections import Counter

import torch

from chapters.common import SHIPPED
from chapters.day35_stress.snapshot.verdict import mismatches
from nanoserve.bench.batchbench import workload
from nanoserve.bench.stress import run_stress
from nanoserve.engine.engine import Engine
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request, RequestState
from nanoserve.engine.scheduler import Scheduler

torch.set_num_threads(2)

# %% [markdown]
# ## 1. A small stress run
#
# Twelve requests (seed 0): prompts of 2 to 20 random token ids, 1 to 40 greedy tokens each
# with EOS ignored, block_size 4, 8 slots, a 16-block pool, and before every iteration a 5%
# chance of aborting a random unfinished request. `run_stress` first runs the same workload
# through a roomy engine for reference, then the cramped one with the aborts.

# %%
SMALL = dict(requests=12, seed=0, num_kv_blocks=16, abort_rate=0.05)
out = run_stress(SHIPPED, **SMALL)
for k, v in out.items():
    print(f"{k:22s} {v}")

# %% [markdown]
# `invariant_checks` is one more than `iterations`: the hook runs before every `schedule()`,
# including the last one, which finds nothing to do and ends the loop.
#
# ## 2. The verdict rule
#
# A request that finished normally must match the reference exactly. An aborted one stopped
# early, so it must match a prefix of the reference: it may say less, never something else.
# The frozen rule, on a hand-made case:

# %%
outputs = [[1, 2], [1], [1, 3]]
aborted = [False, True, False]
reference = [[1, 2], [1, 2], [1, 2]]
print("mismatched requests:", mismatches(outputs, aborted, reference))
print("an aborted request that changed a token:", mismatches([[3]], [True], [[1, 2]]))

# %% [markdown]
# ## 3. What the aborts hit
#
# The abort picks uniformly among unfinished requests, and most unfinished requests are
# waiting: the pool, not the slot count, limits how many run. A host-only replay of the same
# schedule (the live scheduler over integer tokens, the same random stream) shows which path
# each abort took. It needs no model, because with EOS ignored the schedule depends only on
# lengths.


# %%
def abort_targets(requests: int, seed: int, num_blocks: int, rate: float = 0.05) -> Counter:
    prompts, gens = workload(requests, seed, (2, 20), (1, 40), 2048)  # nanoserve-tiny's vocab
    sched = Scheduler(KVCacheManager(num_blocks, 4), 8, allocation="incremental")
    reqs = [Request(i, p, max_tokens=g) for i, (p, g) in enumerate(zip(prompts, gens,
                                                                       strict=True))]
    for r in reqs:
        sched.add(r)
    rng, hit = random.Random(seed + 1), Counter()
    while True:
        live = [r for r in reqs if r.state is not RequestState.FINISHED]
        if live and rng.random() < rate:
            v = rng.choice(live)
            kind = ("running" if v.state is RequestState.RUNNING else
                    "waiting, preempted earlier" if v.num_preemptions else
                    "waiting, never started")
            hit[kind] += 1
            sched.abort(v)
        out_ = sched.schedule()
        if out_.num_scheduled == 0:
            break
        for r in out_.admitted + out_.decode:
            r.append_token(1)
    return hit


print("this notebook's run:", dict(abort_targets(12, 0, 16)))
print("the chapter's run (40 requests, seed 7):", dict(abort_targets(40, 7, 16)))
print("make stress (200 requests, seed 7, 20 blocks):", dict(abort_targets(200, 7, 20)))

# %% [markdown]
# Most aborts land on requests still in the queue, which is the simplest path. Aborting a
# running request, or a preempted one holding kept tokens, happens a handful of times per run.
#
# ## 4. Does the checker catch a broken engine?
#
# First, the restart bug from Day 33: the prefill reads only the prompt. Patched into the
# `Engine` class for one run, then restored.


# %%
def restart_step(engine, out):
    finished = []
    if out.admitted:
        finished += engine._run(out.admitted, [r.prompt_token_ids for r in out.admitted], True)
    if out.decode:
        finished += engine._run(out.decode, [[r.output_token_ids[-1]] for r in out.decode], False)
    return finished


good_step = Engine.step
Engine.step = restart_step
try:
    broken = run_stress(SHIPPED, **SMALL)
finally:
    Engine.step = good_step
print("restart instead of resume: mismatched requests", broken["mismatched_requests"],
      "| pool full after drain:", broken["pool_full_after_drain"])

# %% [markdown]
# Second, a scheduler whose preemption forgets to return the victim's blocks to the pool. Two
# guards can see it: the invariant check before the next iteration (the pool says more blocks
# are held than the running requests own), and the engine loop's refusal to spin when nothing
# can be scheduled while requests wait. Whichever comes first stops the run with an error.


# %%
def leaky_preempt(self, victim):
    self.running.remove(victim)
    if self.on_release is not None:
        self.on_release(victim)
    victim.blocks = []  # the bug: the allocator is never told
    heapq.heappush(self._free_slots, victim.slot)
    victim.slot = None
    victim.transition(RequestState.WAITING)
    victim.num_preemptions += 1
    self.waiting.appendleft(victim)
    self.preemptions += 1


good_preempt = Scheduler._preempt
Scheduler._preempt = leaky_preempt
try:
    run_stress(SHIPPED, **SMALL)
    print("no complaint (!)")
except AssertionError as e:
    print("invariant check failed:", e)
except RuntimeError as e:
    print("the engine loop refused to spin:", e)
finally:
    Scheduler._preempt = good_preempt
