# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 33 notebook: blocks a step at a time, and who pays when they run out
#
# Most of this notebook needs no model: the scheduler is bookkeeping, and it can be driven by
# hand over a real `BlockAllocator` with made-up token ids. The last part loads the shipped
# nanoserve-tiny model and checks the one property that needs real numbers. On a CPU, in about
# half a minute:
#
# 1. the allocation rule, `blocks_needed_for`, under both policies, and a boundary crossing;
# 2. a preemption by hand: the youngest running request is the victim and goes to the head of
#    the queue;
# 3. a request with nobody younger than itself is its own victim;
# 4. the preempted request comes back with its tokens, and what its return costs;
# 5. why an admission-side reserve cannot replace preemption;
# 6. the chapter's table through the host-only harness;
# 7. a cramped engine against a roomy one on nanoserve-tiny: identical tokens;
# 8. what a *restart* instead of a *resume* would have produced;
# 9. the two block lists that must agree, and `sync_blocks` refusing a mismatch.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from nanoserve.bench.schedbench import run_scheduled
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request, RequestState
from nanoserve.engine.scheduler import Scheduler

torch.set_num_threads(2)


def show(s: Scheduler, out, it: int) -> None:
    """One line per iteration: what schedule() decided, and who holds which blocks."""
    held = "  ".join(f"{r.request_id}:{r.blocks}" for r in s.running)
    print(f"it {it:2d}  admit {[r.request_id for r in out.admitted]!s:10s} "
          f"decode {[r.request_id for r in out.decode]!s:16s} "
          f"preempt {[r.request_id for r in out.preempted]!s:6s} | {held} | "
          f"waiting {[r.request_id for r in s.waiting]} free {s.kv_cache_manager.num_free}")


def step(s: Scheduler, it: int, quiet: bool = False):
    """schedule(), then one made-up token for every scheduled request (the model's part)."""
    out = s.schedule()
    for r in out.admitted + out.decode:
        r.append_token(100 + len(r.output_token_ids))
    s.check_invariants()
    if not quiet:
        show(s, out, it)
    return out


# %% [markdown]
# ## 1. One rule for every state
#
# `blocks_needed_for(r)` is the number of blocks to add before `r`'s next forward. Under
# `"reserve"` (Week 8) the target is the worst case, prompt plus `max_tokens`, and it is all
# bought at admission. Under `"incremental"` (Day 33) the target is what the request's tokens
# occupy now. A request's newest token is not in the cache yet: the next forward writes it.
# So a running request needs a block exactly when that token is the first of a new block.

# %%
for policy in ("reserve", "incremental"):
    s = Scheduler(KVCacheManager(64, 4), 4, allocation=policy)
    r = Request("r", [7] * 5, max_tokens=24)
    s.add(r)
    needs, bought_at = [], []
    for it in range(1, 14):
        needs.append(s.blocks_needed_for(r))
        if it > 1 and needs[-1]:
            bought_at.append(r.num_tokens)
        step(s, it, quiet=True)
    print(f"{policy:12s} blocks added before each of the first 13 forwards: {needs}; "
          f"holds {len(r.blocks)} after {r.num_tokens} tokens")
    print(f"{'':12s} {needs[0]} at admission; one block bought later at each of tokens: "
          f"{bought_at or 'none'}")

# %% [markdown]
# Incremental: enough blocks for the 5-token prompt, then one more before each forward whose
# newest token starts a new block (the token counts are printed above). Reserve: the whole
# worst case on the first step, and never again.

# %% [markdown]
# ## 2. A preemption by hand
#
# Six blocks of four tokens, three slots, four requests with 4-token prompts and 12 tokens of
# budget each. `a`, `b`, `c` are admitted (one block each); `d` waits for a slot. When the three
# cross into their second block the pool has exactly three free, so nobody is hurt. At the next
# boundary the pool is dry: growth runs oldest first, `a` needs a block, and the victim is the
# youngest running request, `c`.

# %%
s = Scheduler(KVCacheManager(6, 4), 3, allocation="incremental")
reqs = {n: Request(n, [7] * 4, max_tokens=12) for n in "abcd"}
for r in reqs.values():
    s.add(r)
for it in range(1, 7):
    out = step(s, it)

# %% [markdown]
# At iteration 6, `c` gave back its two blocks and its slot, and `a` and `b` grew into them.
# `c` kept its five generated tokens and went to the *head* of the waiting queue, in front of
# `d`, which has been waiting longer but never started. `d` still cannot enter: the slot `c`
# gave up is free, but no block is.

# %%
c = reqs["c"]
print(c, "state", c.state.value, "| slot", c.slot, "| blocks", c.blocks)
print("tokens it keeps:", c.output_token_ids, "| preemptions:", c.num_preemptions)
print("blocks it needs to come back:", s.blocks_needed_for(c),
      f"(prompt 4 + {len(c.output_token_ids)} generated = {c.num_tokens} tokens)")
print("reservation_waste:", s.reservation_waste(),
      "| fragmentation_waste:", round(s.fragmentation_waste(), 3))

# %% [markdown]
# Run on. The next boundary takes `b` for `a`; `a`, the oldest, is never chosen, so it
# finishes, and its blocks let the others back in, oldest first.

# %%
it = 6
while s.has_unfinished():
    it += 1
    out = step(s, it)
print("preemptions:", s.preemptions, "| tokens re-prefilled on resume:", s.recomputed_tokens)
print({n: (r.num_preemptions, r.finish_reason) for n, r in reqs.items()})

# %% [markdown]
# ## 3. Its own victim
#
# Three blocks, two requests. After the prefill each holds one block and one is free. Both
# cross a boundary on the next step. `a` (older) takes the free block; `b` needs one, the pool
# is dry, and the youngest running request is `b` itself.

# %%
s = Scheduler(KVCacheManager(3, 4), 2, allocation="incremental")
a, b = Request("a", [7] * 4, max_tokens=8), Request("b", [7] * 4, max_tokens=8)
s.add(a)
s.add(b)
for it in range(1, 3):
    out = step(s, it)
print("b preempted itself:", out.preempted == [b], "| b keeps", b.output_token_ids)

# %% [markdown]
# ## 4. Coming back: resume, not restart
#
# `b` needs blocks for its prompt plus the token it already generated (5 tokens, 2 blocks), and
# waits until `a` finishes. When it is admitted again, the engine's prefill runs over
# `b.token_ids`, prompt and output together, so it continues where it stopped.
# `recomputed_tokens` counts every position that prefill computes again.

# %%
while b.state is not RequestState.RUNNING:
    it += 1
    out = step(s, it)
print(f"b is back at iteration {it}: prefill over {len(b.token_ids) - 1} tokens, "
      f"outputs so far {b.output_token_ids}")
print("recomputed_tokens:", s.recomputed_tokens)
while s.has_unfinished():
    it += 1
    step(s, it, quiet=True)
print("b finished:", b.finish_reason, b.output_token_ids)

# %% [markdown]
# (The prefill at the resume produced `b`'s second token, so `token_ids` above already includes
# it; the prefill itself ran over 5 positions: 4 prompt tokens and the one kept token.)
#
# ## 5. Why no admission reserve saves you
#
# Suppose admission kept back one free block per running request, so that every request can
# cross its next boundary. Four requests of the table's shape in a 12-block pool: admitted with
# 2 blocks each, 4 left over, exactly the reserve. Count what they need as they grow.

# %%
pool = 12
for tokens in (5, 9, 13, 17):
    held = 4 * -(-tokens // 4)
    print(f"every request at {tokens:2d} tokens: {held:2d} blocks needed, "
          f"{pool - held:3d} free{'  <- someone must give blocks back' if held > pool else ''}")

# %% [markdown]
# The reserve covers one crossing. The next crossing finds the pool empty again, and any fixed
# reserve smaller than the whole worst case is used up the same way a few crossings later. The
# only reserve that never runs out is Week 8's. Anything less needs a way to take blocks back
# from a running request: preemption.
#
# ## 6. The chapter's table
#
# Four requests, 5-token prompts, 24 tokens each, 4 slots, block_size 4, through the live
# scheduler in the host-only harness (`nanoserve bench sched`). Counts, the same on any machine.

# %%
print(f"{'pool':>5} {'policy':12s} {'iters':>5} {'occ':>6} {'preempt':>7} {'recomp':>6} "
      f"{'frag':>6} {'reserv':>6}")
for pool_tokens in (48, 96, 128):
    for policy in ("reserve", "incremental"):
        t = run_scheduled(4, 4, pool_tokens, 5, [24], 4, policy)
        pre = t["preemptions"] if policy == "incremental" else "n/a"
        print(f"{pool_tokens:5d} {policy:12s} {t['forward_passes']:5d} {t['occupancy']:6.3f} "
              f"{pre!s:>7} {t['recomputed_tokens']:6d} {t['fragmentation_waste']:6.3f} "
              f"{t['reservation_waste']:6.3f}")

# %% [markdown]
# `frag` and `reserv` are means over the iterations that ran the model. Under `reserve` the
# `reserv` column says that close to half of the blocks held are empty on an average step;
# under `incremental` none are, and the only slack is the part of each request's last block
# that no token fills yet.
#
# On the Day-29 shape (8 requests with 5-token prompts; `max_tokens` 4 for seven, 32 for the
# last; 8 slots) the same change appears as memory: the peak number of blocks held while all
# eight run together.

# %%
gens = [4] * 7 + [32]
for policy in ("reserve", "incremental"):
    t = run_scheduled(8, 4, 1024, 5, gens, 8, policy)
    print(f"{policy:12s} peak blocks {t['peak_blocks_held']}")
tight = run_scheduled(8, 4, 64, 5, gens, 8, "incremental")
print(f"incremental in a 16-block pool: {tight['forward_passes']} iterations, "
      f"{tight['preemptions']} preemptions")

# %% [markdown]
# ## 7. Cramped against roomy, on the model
#
# The claim that matters cannot be checked with integer tokens: a preempted request must produce
# the text it would have produced without the interruption. Ten prompts through nanoserve-tiny
# (float32, greedy, EOS ignored, block_size 4, 6 slots), once with the default pool and once
# with 14 blocks.

# %%
from nanoserve import LLM, SamplingParams

kw = dict(dtype="float32", block_size=4, max_num_seqs=6)
prompts = [[0, *range(3 + i, 8 + i + i % 4)] for i in range(10)]
params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i, ignore_eos=True)
          for i in range(10)]
roomy, cramped = LLM(SHIPPED, **kw), LLM(SHIPPED, num_kv_blocks=14, **kw)
a_out, b_out = roomy.generate(prompts, params), cramped.generate(prompts, params)
same = sum(x.token_ids == y.token_ids for x, y in zip(a_out, b_out, strict=True))
print(f"{same} of 10 identical | roomy: {roomy.stats.preemptions} preemptions | cramped: "
      f"{cramped.stats.preemptions} preemptions, {cramped.stats.recomputed_tokens} tokens "
      f"re-prefilled")
print("preemptions per request (cramped):", [o.num_preemptions for o in b_out])
print("iterations: roomy", roomy.stats.iterations, "| cramped", cramped.stats.iterations)

# %% [markdown]
# ## 8. The restart that still runs
#
# What if the prefill had read `prompt_token_ids` instead of `token_ids`? The patch below swaps
# the engine's `step` on one instance for that version. The cache then holds only the prompt,
# the sampled token is appended after the kept ones, and the request carries on.

# %%
import types


def restart_step(engine, out):
    finished = []
    if out.admitted:  # the bug: the prompt only, as if nothing had been generated
        finished += engine._run(out.admitted, [r.prompt_token_ids for r in out.admitted], True)
    if out.decode:
        finished += engine._run(out.decode, [[r.output_token_ids[-1]] for r in out.decode], False)
    return finished


broken = LLM(SHIPPED, num_kv_blocks=14, **kw)
broken.engine.step = types.MethodType(restart_step, broken.engine)
c_out = broken.generate(prompts, params)
print("same lengths as roomy:", [len(o.token_ids) for o in c_out] ==
      [len(o.token_ids) for o in a_out])
print("identical tokens:", sum(x.token_ids == y.token_ids for x, y in zip(a_out, c_out,
                                                                          strict=True)), "of 10")
i = next(i for i, o in enumerate(c_out) if o.token_ids != a_out[i].token_ids)
j = next(k for k, (x, y) in enumerate(zip(a_out[i].token_ids, c_out[i].token_ids,
                                            strict=True)) if x != y)
print(f"request {i}, from position {j}: roomy {a_out[i].token_ids[j - 2:j + 4]} | "
      f"restarted {c_out[i].token_ids[j - 2:j + 4]}")

# %% [markdown]
# Every request got its full count of tokens, the pool drained, nothing raised. Only a
# comparison against an engine that never preempted shows the damage.
#
# ## 9. Two block lists that must agree
#
# The scheduler's record is `request.blocks`; the addressing the forward uses is the row's
# `BlockTable`. `sync_blocks` extends the table with whatever the request holds beyond it, and
# refuses when the table is not a prefix of the request's list.

# %%
eng = LLM(SHIPPED, num_kv_blocks=8, **kw).engine
r = Request("x", [5, 6, 7], max_tokens=4)
r.slot, r.blocks = 0, [3]
eng.sync_blocks(r)
r.blocks = [3, 5]  # the scheduler bought one more
eng.sync_blocks(r)
print("row 0 now addresses", eng.cache.tables[0].blocks)
r.blocks = [4, 5, 6]  # a list that drifted from the row's
try:
    eng.sync_blocks(r)
except RuntimeError as e:
    print("refused:", e)
r.blocks = [3, 5]
eng.release_row(r)
print("after release_row, row 0 addresses", eng.cache.tables[0].blocks)
