# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 36 notebook: the engine core, stepped by hand
#
# On a CPU, in well under half a minute, with the live `nanoserve` package and the shipped
# nanoserve-tiny model (float32, greedy, EOS ignored, block_size 4):
#
# 1. one long-lived `EngineCore`: requests added between steps, each step's deltas printed;
# 2. the deltas add up: a staggered run against `LLM.generate`, token for token, character for
#    character;
# 3. a stop string, streamed with and without the hold-back;
# 4. an abort mid-run, and where the blocks are a moment later;
# 5. a forward that raises, and the requests that survive it;
# 6. the package's core against the frozen Day 36 snapshot, count for count.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day36_engine_core.claims import (
    ABORTS,
    CRAMPED,
    STOP,
    STOP_PROMPT,
    WORKLOAD,
    add_package,
    add_snapshot,
    drive,
    greedy,
    joined,
)
from chapters.day36_engine_core.snapshot.core import EngineCore as SnapshotCore
from nanoserve import LLM
from nanoserve.tokenizer import IncrementalDetokenizer

# One thread: on a small shared CPU a second OpenMP thread mostly waits for a core.
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One core for the engine's life
#
# `LLM` builds its `EngineCore` once; `llm.core` is it. A 16-block pool (64 token positions)
# and 4 slots. Three requests go in one at a time, between steps, and every `step()` returns a
# `RequestDelta` for each request that has news.

# %%
llm = LLM(SHIPPED, **CRAMPED)
core, pool = llm.core, llm.core.scheduler.kv_cache_manager
tok = llm.tokenizer
prompts = {"a": "The for statement", "b": "Classes provide", "c": "A tuple"}
with torch.inference_mode():
    for n in range(8):
        if n < 3:
            rid = "abc"[n]
            core.add_request(rid, tok.encode(prompts[rid]), greedy(4))
            print(f"            add_request({rid!r})")
        if not core.has_unfinished():
            break
        deltas = core.step()
        print(f"step {n + 1}: " + "  ".join(
            f"{d.request_id}:{d.new_token_ids}{d.new_text!r}{' done' if d.finished else ''}"
            for d in deltas) + f"   blocks held {pool.num_held}/{pool.num_blocks}")
    while core.has_unfinished():
        core.step()
core.check_drained()
print("drained: every block and slot back; iterations so far:", core.counters.iterations)

# %% [markdown]
# Each request gets one delta per token and exactly one with `finished=True`. The step after
# the last one finds nothing to schedule: it only releases the finished requests' blocks.
#
# ## 2. The deltas add up to `generate`
#
# The chapter's workload: 12 requests (seed 36), prompts of 2-20 random ids, 1-30 tokens each,
# every third with the stop string `" the"`. `generate` runs them all at once; then the same
# core takes them one every other step, and the joined deltas are compared with the outputs.

# %%
offline = llm.generate([ids for ids, _, _ in WORKLOAD],
                       [greedy(m, stop) for _, m, stop in WORKLOAD])
steps = drive(core, add_package, aborts={})
streams = joined(steps)
bad = [i for i, o in enumerate(offline)
       if (streams[f"r{i}"]["tokens"], streams[f"r{i}"]["text"]) != (o.token_ids, o.text)]
print(f"requests whose streamed tokens or text differ from generate's: {len(bad)} of 12")
print(f"{sum(map(len, steps))} deltas over {len(steps)} steps; finished deltas per request:",
      sorted({s['finished'] for s in streams.values()}))
for i in (0, 3):
    print(f"r{i}: {streams[f'r{i}']['reason']:6s} {streams[f'r{i}']['text']!r}")

# %% [markdown]
# ## 3. A stop string, streamed
#
# Greedy from this prompt, the model writes `while_stmt`, which arrives as three tokens:
# `" while"`, `"_"`, `"stmt"`. With `stop=["while_stmt"]` the final text ends just before it.
# A stream that passed on the detokenizer's text as it grew would already have shown
# `" while_"` when the match completes, and a stream cannot take characters back. So while a
# request with stop strings runs, the core holds back its last `len(longest stop) - 1`
# characters, here 9.

# %%
ids = tok.encode(STOP_PROMPT)
final = llm.generate([ids], greedy(30, [STOP]))[0].text
r = core.add_request("stop", ids, greedy(30, [STOP]))
streamed = ""
with torch.inference_mode():
    while core.has_unfinished():
        for d in core.step():
            streamed += d.new_text
        decoded = r.detokenizer.text if not r.is_finished else r.text
        print(f"decoded {len(decoded):3d} chars, streamed {len(streamed):3d}: "
              f"...{streamed[-24:]!r}")
print("final text:", repr(final))
print("streamed == final:", streamed == final, "| stop string ever streamed:", STOP in streamed)

# %% [markdown]
# ## 4. An abort mid-run
#
# Four requests with 5-token prompts run for three steps; then two are aborted. Their blocks
# are back in the pool when `abort_request` returns, with no step in between; the next step
# reports them once, with `finish_reason="abort"`.

# %%
reqs = [core.add_request(f"a{i}", [3 + i] * 5, greedy(40)) for i in range(4)]
with torch.inference_mode():
    for _ in range(3):
        core.step()
    print("held before:", pool.num_held, "| the two hold:", sum(len(r.blocks) for r in reqs[:2]))
    core.abort_request("a0"), core.abort_request("a1")
    print("held right after the aborts:", pool.num_held)
    print("abort again:", core.abort_request("a0"), "| unknown id:", core.abort_request("zz"))
    print("next step:", [(d.request_id, d.finish_reason) for d in core.step() if d.finished])
    while core.has_unfinished():
        core.step()
core.check_drained()

# %% [markdown]
# ## 5. A forward that raises
#
# Six requests, four slots, and an engine whose second step raises. The four requests in that
# step end with `"error"` and give their blocks back; the two still waiting run afterwards as
# if nothing had happened.

# %%
real, calls = llm.engine.step, [0]


def flaky(out):
    calls[0] += 1
    if calls[0] == 2:
        raise RuntimeError("injected")
    return real(out)


llm.engine.step = flaky
try:
    for i in range(6):
        core.add_request(f"f{i}", [7 + i] * 5, greedy(6))
    ends = joined(drive(core, add_package, work=[], aborts={}))
finally:
    del llm.engine.step
for rid, j in ends.items():
    print(rid, j["reason"], len(j["tokens"]), "tokens")
print("pool after:", pool.num_free, "of", pool.num_blocks, "free")

# %% [markdown]
# ## 6. The package against the Day 36 snapshot
#
# The snapshot is the same idea written over the earlier days' frozen modules (Day 33's
# scheduler, Day 17's paged cache, Day 27's padded forward). The workload again, now with
# aborts of r4 and r9 mid-run, through both. Counts for the package are differences across the
# run, because this core has been working all notebook long.

# %%
names = ("iterations", "forward passes", "row-steps", "deltas", "preemptions",
         "tokens recomputed")


def package_counts(deltas=0):
    e, s = llm.engine, core.scheduler
    return (core.counters.iterations, e.forward_passes, e.row_steps, deltas, s.preemptions,
            s.recomputed_tokens)


before = package_counts()
mine = drive(core, add_package)
after = package_counts(sum(map(len, mine)))
snap = SnapshotCore(load_model(SHIPPED), 16, 4, 4,
                    detokenizer=lambda ids: IncrementalDetokenizer(tok, ids))
theirs = drive(snap, add_snapshot)
print(f"aborted: {ABORTS}")
print(f"{'':>18} {'package':>8} {'snapshot':>9}")
snap_counts = (snap.iterations, snap.forward_passes, snap.row_steps, snap.deltas,
               snap.scheduler.preemptions, snap.scheduler.recomputed_tokens)
for name, a, b, s in zip(names, after, before, snap_counts, strict=True):
    print(f"{name:>18} {a - b:8d} {s:9d}")
a, b = joined(mine), joined(theirs)
print("requests with identical deltas:", sum(a[k] == b[k] for k in a), "of", len(a))
print("finish reasons:", {k: v["reason"] for k, v in a.items()})
