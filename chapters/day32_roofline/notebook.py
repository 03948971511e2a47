# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 32 notebook: the roofline
#
# How fast can a decode step be on this machine? In about a minute on a CPU, with the live
# `nanoserve.LLM` on random weights in the SmolLM2-135M shape:
#
# 1. the step's bill: bytes read and FLOPs done, from the config and from the tensors;
# 2. the ridge, as the machine's balance and the context change;
# 3. this machine's two rates: a streaming read and a large float32 matmul;
# 4. the engine's decode steps at a few row counts, against their floor.
#
# Every value below is printed by the functions of the chapter's `claims.py`, so the notebook
# and the numbers table cannot disagree. The timings belong to the machine that ran the
# notebook, on one thread; the chapter's claims say which of them are bounds.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day32_roofline import claims
from nanoserve.bench.hardware import describe_hardware
from nanoserve.bench.roofline import floor_s, report

print(describe_hardware())

# %% [markdown]
# ## 1. The bill of one decode step
#
# Every weight is read once a step, whatever the rows; every linear weight does one
# multiply-add, two FLOPs, per row. Attention adds a little per position each row attends to.
# The second count walks the tensors of the Day 1 model built on the meta device.

# %%
c = claims.cost()
print(c)
print("params, bytes:", claims.bill_row())
print("FLOPs per row:", claims.flops_row())
print("attention per position, FLOPs then K/V bytes:", claims.attention_row())
print("intensity, 1 row then 64 rows (FLOPs per byte):", claims.intensity_row())

# %% [markdown]
# ## 2. Where the two costs cross
#
# On a machine that does `balance` FLOPs in the time it reads a byte, the floor's two terms
# meet at the ridge. In float32 with a short context the ridge is about twice the balance. A
# long context makes every row read its own K/V, and past some length the step never becomes
# bound by its arithmetic: the ridge is infinite.

# %%
for context in (8, 512, 4096):
    rows = claims.ridges(context, balances=(2.0, 5.0, 10.0, 20.0, 40.0))
    print(f"context {context:5d}: ridge at balance 2, 5, 10, 20, 40 ->",
          ", ".join(f"{r:.1f}" for r in rows))
print(f"floor at 64 rows / floor at 1 row, balance 10: {claims.floor_ratio():.2f}x")
for balance in (2.0, 5.0, 10.0, 20.0):
    one, many = (floor_s(c, r, 8, 1.0, balance) for r in (1, 64))
    print(f"balance {balance:4.0f}: tokens/s at 64 rows / at 1 row, at the floor: "
          f"{64 * one / many:.1f}x")

# %% [markdown]
# ## 3 and 4. This machine's rates and the engine's steps
#
# A short version of the chapter's run: three row counts, two interleaved rounds, on one
# thread pinned to one core. The read, the matmuls and the engine's steps take turns in each
# round, and each keeps its best.

# %%
rf = claims.measure(rows=(1, 8, 64), rounds=2)
print(report(rf))
print(f"lowest distance: {min(rf.distance(r) for r in rf.steps):.2f}x; "
      f"tokens/s gain, 64 rows / 1 row: {claims.tokens_per_s_gain(rf):.1f}x")
print("the engine:", claims.llm().binding.describe(), "|", claims.llm().prepack_reason)
