# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 61 notebook: split-K
#
# A row's context cut into segments, one program each, merged by their log-sum-exps. On this
# CPU (no GPU) the kernel runs under Triton's interpreter, in float32. In a few seconds:
#
# 1. one row split by hand and merged, against one softmax;
# 2. the kernel split and unsplit, against the reference, with empty segments;
# 3. the rule's choices for Llama-3.2-1B-shaped batches, from the launch grid;
# 4. the caveat: one row's eager growth through the rule, against a captured width.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day60_paged_kernel.claims import case, launch_lens, reference, rel, workspace
from chapters.day61_split_k.snapshot import split_k
from nanoserve.cuda.kernels import choose_splits, paged_attention

torch.set_num_threads(1)

# %% [markdown]
# ## 1. Split by hand
#
# One row of base-2 scores and their values, cut into three uneven pieces. Each piece keeps
# only its normalised output and its LSE; the merge weights them by `2^(lse - max)`.

# %%
g = torch.Generator().manual_seed(61)
s = torch.randn(1, 700, generator=g, dtype=torch.float64) * 3
v = torch.randn(700, 4, generator=g, dtype=torch.float64)
parts, lses = [], []
for lo, hi in ((0, 256), (256, 512), (512, 700)):
    top = s[:, lo:hi].amax(1)
    p = torch.exp2(s[:, lo:hi] - top[:, None])
    parts.append(p @ v[lo:hi] / p.sum(1)[:, None])
    lses.append(top + torch.log2(p.sum(1)))
    print(f"segment {lo:3d}-{hi:3d}: lse {lses[-1].item():7.3f}")
merged = split_k.merge(torch.stack(parts), torch.stack(lses))
whole = torch.softmax(s * torch.log(torch.tensor(2.0, dtype=torch.float64)), -1) @ v
print("merged vs one softmax, max relative error:", f"{rel(merged, whole):.1e}")

# %% [markdown]
# ## 2. The kernel, split and unsplit
#
# Three ragged rows; 3 segments forced, so boundaries fall inside rows; then a 1-token row in 4
# segments, three of which hold nothing (lse = -inf, weight 0).

# %%
q, k, v, tables, cells, ctx = case([1, 13, 53], 16, 2, 2, 48)
ref = reference(q, k, v, cells, ctx)
one = paged_attention(q, k, v, tables, ctx, 16, splits=1, tile=16)
split = paged_attention(q, k, v, tables, ctx, 16, splits=3, tile=16)
mine, part, lse = split_k.split_attention(q, k, v, tables, ctx, 16, 3, tile=16)
print(f"split vs one pass {rel(split, one):.1e}, split vs reference {rel(split, ref):.1e}, "
      f"snapshot vs kernel {rel(mine, split):.1e}")
print("row 0's LSEs per segment (head 0):", lse[0, 0].tolist())
q, k, v, tables, cells, ctx = case([1], 4, 1, 2, 32, extra_width=5)
out = paged_attention(q, k, v, tables, ctx, 4, splits=4, tile=16)
print(f"1-token row in 4 segments vs reference: {rel(out, reference(q, k, v, cells, ctx)):.1e}")

# %% [markdown]
# ## 3. The rule, from the launch grid
#
# A recorder stands in for the kernels, so these launches are built, not run. The rule sees the
# rows, the KV heads and the table's width, and nothing else.

# %%
for lens in [(4096,), (1024,) * 8, (1024,) * 64, (32768,) * 2, (100, 700, 2000, 4000)]:
    log = launch_lens(lens)
    grid, seg = log[0][1], log[0][3]
    label = f"{len(lens)} rows, longest {max(lens):,}"
    print(f"{label:24s} grid {grid}, segment {seg} tokens, {len(log)} launch(es), "
          f"kernel workspace {workspace('triton', list(lens)):,} bytes")

# %% [markdown]
# ## 4. The width the rule is given
#
# Eagerly, the engine's table is as wide as this step's longest row needs, so the rule's answer
# moves as a row grows. A captured window's table is its buffer, as wide as `max_model_len`.

# %%
eager = [choose_splits(1, 8, -(-n // 16) * 16, 64) for n in range(1, 4097)]
changes = [(n, eager[n - 1]) for n in range(1, 4097) if n == 1 or eager[n - 1] != eager[n - 2]]
print(f"eager: {len(set(eager))} distinct paths; the first few changes:")
for n, path in changes[:8]:
    print(f"  from {n:5d} tokens: {path}")
captured = {choose_splits(1, 8, 4096, 64) for _ in range(1, 4097)}
print("captured at width 4,096:", captured)
