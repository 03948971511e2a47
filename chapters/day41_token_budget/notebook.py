# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 41 notebook: spending a token budget
#
# The first half needs no model: a budget is bookkeeping, and the package's `Scheduler` can be
# driven over a real `BlockAllocator` with integer tokens. The second half runs the shipped
# nanoserve-tiny model (float32, greedy, EOS ignored). On a CPU, in a few seconds:
#
# 1. the worked schedule, step by step, with a budget of 16 tokens;
# 2. the same requests without a budget, and where the long prompt's first token lands;
# 3. the package's scheduler against the frozen Day 41 snapshot (and Day 33's, without a budget);
# 4. the worked workload on the model: one forward per step, the long request mid-prefill;
# 5. the text does not change: greedy outputs over five budget settings against whole prompts;
# 6. the refusals;
# 7. one round of the streaming shape, timed: what thirty decoding requests feel when a
#    900-token prompt arrives.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import hardware
from chapters.day41_token_budget import claims
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler

torch.set_num_threads(1)  # on a small shared CPU a second thread mostly waits for a core

# %% [markdown]
# ## 1. The worked schedule
#
# A 64-block pool of 4-token blocks, 8 slots, `max_num_batched_tokens=16`. Four requests with
# 3-token prompts (8 tokens each) are added before step 1; a 40-token prompt (3 tokens) before
# step 2. After every `schedule()` the "engine" here is one line: each request in
# `out.sampled` gets a token. A chunk short of its prompt's end is not in `out.sampled`.

# %%
sched = Scheduler(KVCacheManager(64, 4), 8, allocation="incremental",
                  max_num_batched_tokens=16)
shorts = [Request(f"d{i}", [1] * 3, max_tokens=8) for i in range(4)]
long = Request("long", [1] * 40, max_tokens=3)
for r in shorts:
    sched.add(r)
step = 0
while sched.has_unfinished():
    step += 1
    if step == 2:
        sched.add(long)
    out = sched.schedule()
    if not out.num_scheduled:
        break
    chunks = [(c.request.request_id, c.start, c.n) for c in out.chunks]
    print(f"step {step}: {out.num_batched_tokens:2d} tokens  decode "
          f"{[r.request_id for r in out.decode]}  chunks {chunks}  "
          f"sampled {[r.request_id for r in out.sampled]}")
    for r in out.sampled:
        r.append_token(1)
print("long:", long.finish_reason, "after", len(long.output_token_ids), "tokens;",
      "blocked on the budget", sched.blocked_on_budget, "times")

# %% [markdown]
# The four decodes always come first, one token each. What is left of the budget goes to the
# long prompt, chunk by chunk, and the step that carries its last chunk is the one that samples
# its first token. Between chunks the request is RUNNING, holds its slot and its blocks, and
# `num_computed_tokens` says how far its K/V reaches.
#
# ## 2. Without a budget
#
# The same requests through the harness in `snapshot/harness.py`, which records every step,
# with the budget and without one (`max_num_batched_tokens=None`, the scheduler of Days 31-40).

# %%
for budget in (16, None):
    steps = claims.worked("live", budget)
    print(f"budget {budget}: tokens per step {[s.tokens for s in steps]}; largest step "
          f"{max(s.tokens for s in steps)}; the long prompt's first token on step "
          f"{claims.first_token_step(steps)}")

# %% [markdown]
# Without the budget, step 2 computes the whole prompt and the four decodes wait for it, the
# largest step of either schedule. With the budget no step computes more than the budget, and
# the long prompt pays with a later first token.
#
# ## 3. The package against the snapshot
#
# The snapshot is a frozen copy of the budgeting scheduler, over Day 14's allocator and
# Day 33's requests. The same frozen harness drives both, so every step's chunks, decodes,
# sampled requests, preemptions, releases and blocks held can be compared. Then 200 seeded
# random shapes: block sizes, slots, cramped pools, both allocation policies, a budget or none,
# chunking on or off, arrivals and aborts.

# %%
print("worked schedule identical:", claims.worked("live") == claims.worked("snapshot"))
print("no budget, package vs Day 33 snapshot:",
      claims.worked("live", None) == claims.worked("day33"))
print(claims.random_comparison())
w = claims.random_workload(3)
print("seed 3:", {k: v for k, v in w.items() if k != "requests"})
for s in claims.random_trace(w, "live")[:6]:
    print("  ", s)

# %% [markdown]
# ## 4. The worked workload on the model
#
# The same shape through `LLM(...).core`, nanoserve-tiny in float32, one step at a time. Each
# step records how many forwards the engine ran and whether the step was *mixed*: prefill
# chunks and decode rows in one packed forward.

# %%
for chunked in (True, False):
    run = claims.worked_engine(chunked)
    print("budget 16" if chunked else "whole prompts",
          [(s["tokens"], s["forwards"], "mixed" if s["mixed"] else "") for s in run["steps"]])
    print("   decode-only forwards:", run["decode_forwards"])
run = claims.worked_engine()
print("the long request after each step: row length",
      [s["long_len"] for s in run["steps"]][1:6], "tokens out",
      [s["long_out"] for s in run["steps"]][1:6])

# %% [markdown]
# Whole prompts run step 2 as two forwards, the prefill and then the decode; the budget runs
# every step as one. That is also why a chapter whose table counts forwards and decode steps,
# such as Day 36, builds its engine with `enable_chunked_prefill=False`. Day 36's own workload,
# iterations, forward passes and row-steps, chunking off and then on:

# %%
print(claims.day36_counts())

# %% [markdown]
# ## 5. The text does not change
#
# Five prompts (5, 64, 150, 9 and 33 tokens, one added every three steps), 12 greedy tokens
# each, under five budget settings, the smallest a budget of 1 token with one slot, against
# whole prompts with chunking off.

# %%
runs = claims.identity_runs()
for kw, r in zip(claims.BUDGETS, runs["chunked"], strict=True):
    same = sum(r["tokens"][k] == runs["whole"]["tokens"][k] for k in r["tokens"])
    print(f"{kw or 'default (512)'}: {len(r['steps'])} steps, {same} of 5 outputs identical, "
          f"most forwards in a step {max(s['forwards'] for s in r['steps'])}")
print("differ:", claims.identity())

# %% [markdown]
# ## 6. Refusals
#
# A budget below `max_num_seqs` could not decode a full batch in one step; without chunking a
# budget below `max_model_len` could leave a prompt waiting forever. Both are refused when the
# engine is built, naming the numbers.

# %%
print(claims.budget_below_seqs())
print(claims.whole_prompts_short_budget())
print("default budgets, chunking on and off:", claims.default_budgets())
print(claims.long_prompt_served())

# %% [markdown]
# ## 7. Thirty streams and a long prompt, timed once
#
# Thirty requests are decoding when a 900-token prompt arrives. One round of each engine (the
# claims take three interleaved rounds and keep each step's least disturbed time). The whole
# prompt's step computes the 900-token prefill and then the thirty decodes; at a budget of 64
# every step carries the thirty decodes and what is left for the prompt.

# %%
print(hardware())
engines = claims.streaming_engines()
for name, lm in engines.items():
    claims.stream_once(lm)  # warm-up
    r = claims.stream_once(lm)
    mean = sum(r["times"]) / len(r["times"])
    print(f"{name:7s}: {r['steps']:2d} steps until its first token, worst step "
          f"{max(r['times']) * 1e3:6.1f} ms, mean {mean * 1e3:5.1f} ms")
