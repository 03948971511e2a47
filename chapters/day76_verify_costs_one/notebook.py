# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 76 notebook: verifying k tokens costs about one
#
# Speculative decoding pays only if scoring 1 + k tokens in one step costs about what decoding
# one does. This notebook works out what k proposals are worth from the snapshot's formula,
# watches the scheduler plan proposals inside a token budget, lays a verify step out as decode
# entries and checks the engine writes the same positions, times the verify step against a
# decode on the shipped model, and follows one verify step's rollback. A CPU gets through it in
# seconds. Section 4 times things, and its ratios differ a little every time it runs.

# %%
import pathlib
import sys

# Find the checkout by walking up from where the notebook runs; Jupyter gives no __file__.
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day76_verify_costs_one import claims
from chapters.day76_verify_costs_one.snapshot.verify_cost import (
    best_k,
    decode_forwards,
    expected_tokens,
    speedup,
)

# %% [markdown]
# ## 1. What k proposals are worth
#
# Each proposal survives with probability `a` if every one before it did; the target always
# adds a token of its own. The expected tokens a step emits is a geometric sum, capped by
# `1 / (1 - a)` however large k grows.

# %%
print("  a   " + "".join(f"k={k:<6d}" for k in (1, 2, 4, 8, 16)) + "cap 1/(1-a)")
for a in (0.3, 0.5, 0.6, 0.8, 0.9):
    row = "".join(f"{expected_tokens(a, k):<8.2f}" for k in (1, 2, 4, 8, 16))
    print(f"  {a:.1f} {row}{1 / (1 - a):.2f}")

# %% [markdown]
# A proposer that costs `c` target steps per proposal divides the gain, and sets a best k.
# n-gram lookup is nearly free (`c = 0`); a draft model costs its own step per proposal.

# %%
for c in (0.0, 0.05, 0.1, 0.2, 0.5):
    k = best_k(0.8, c)
    print(f"a = 0.8, c = {c:.2f}: best k = {k:2d}, speed-up {speedup(0.8, k, c):.2f}x")

# %% [markdown]
# ## 2. The scheduler plans proposals as tokens
#
# Three requests with four-token prompts have sampled one token each; the budget is 12 tokens.
# Every decode gets its one token first, then proposals are handed out oldest first, cut to
# the budget left and to `max_tokens - len(output) - 1`.

# %%
plan = claims.planned()
for name, n in plan["tokens"].items():
    print(f"request {name}: {n} tokens scheduled (1 + {n - 1} proposals)")
print("tokens in the step:", plan["batched"])
print(f"request a: {plan['a_full']} full blocks computed, {plan['a_committed']} committed to the "
      f"prefix cache (the second holds proposals)")

# %% [markdown]
# ## 3. A verify step as decode entries
#
# Each of a row's 1 + k tokens is a decode entry over the row's blocks at its own position, and
# all of a step's entries go through one decode forward. The snapshot's layout against what the
# engine's model was actually called with:

# %%
cap = claims.layer_loop_rows()
print("rows a plain decode step hands the layer loop here:", cap or "none (loop off)")
for k, batch in ((4, 1), (8, 1), (4, 8)):
    got = claims.verify_forwards(k, batch)
    want = decode_forwards([(r, claims.CACHED, 1 + k) for r in range(batch)])
    print(f"{batch} row(s), k = {k}: forwards of {[len(f) for f in got]} entries; "
          f"positions as the snapshot lays them out: {got == [[p for _, p in f] for f in want]}")

# %% [markdown]
# ## 4. What it costs
#
# `Engine.score` of one row with 1 + k tokens against `Engine.decode` of one token, the same row
# at 64 cached tokens, rolled back after every call, interleaved rounds on one thread, the
# fastest call of each. Fewer rounds than `make chapter-76` runs, so noisier.

# %%
ratios = claims.verify_over_decode(claims.tiny_llm().engine, rounds=60)
for k in claims.KS:
    print(f"k = {k}: verify step = {ratios[k]:.2f} decode steps")
print(f"8 rows x (1 + 4) tokens = {ratios['batch']:.2f} eight-row decode steps")

# %% [markdown]
# Put the measured cost into the formula in place of its `1`: for a free proposer at a few
# acceptance rates, which k is best once the verify step costs what was just measured?

# %%
for a in (0.5, 0.8, 0.95):
    best = max(claims.KS, key=lambda k: speedup(a, k, 0.0, ratios[k]))
    print(f"a = {a}: " + ", ".join(f"k={k} {speedup(a, k, 0.0, ratios[k]):.2f}x"
                                    for k in claims.KS) + f"  -> best k = {best}")

# %% [markdown]
# ## 5. Rolling back, and the same tokens
#
# A request of 13 prompt tokens decodes its first token, then is handed four proposals: the
# next two tokens of plain greedy decoding and two wrong ones. One step verifies them; the
# request keeps two, adds the target's own token, and its row is cut back to what it holds.

# %%
r = claims.rollback()
print("tokens, num_computed_tokens, row length, blocks held")
print("  before:", r["before"])
print("  after: ", r["after"])
print("emitted:", r["emitted"], " plain greedy:", r["plain"][:len(r["emitted"])])
same, total, stats = claims.identity()
print(f"greedy with n-gram speculation (k = 4) against without: {same} of {total} tokens equal")
print(f"that run: {stats.num_drafts} verify steps with proposals, {stats.num_draft_tokens} "
      f"proposals, {stats.num_accepted_tokens} accepted, by position {stats.accepted_per_pos}; "
      f"mean acceptance length {stats.mean_acceptance_length:.2f}")
