# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 55 notebook: the CPU paged-attention kernel
#
# `torch.ops.nanoserve.paged_decode_attention` reads each row's K and V where they lie in the
# pool, through the row's block ids, one task per (row, KV head, split of 512 tokens), the GQA
# group scored together, the softmax online. The frozen snapshot writes the same algorithm in
# plain torch. In a few seconds on this CPU:
#
# 1. one row's cells, read through its block table;
# 2. one task by hand: the online softmax, tile by tile, against a plain softmax;
# 3. one long row's splits and their combine, against the compiled kernel;
# 4. the kernel, the frozen model and the reference on ragged batches, and poisoned cells;
# 5. the engine with `attention="cpu"` against the reference read;
# 6. what each decode read materialises, and a quick timing.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day55_cpu_paged_attention import claims
from chapters.day55_cpu_paged_attention.snapshot import paged_decode as snap

torch.set_num_threads(1)
print("C++ ops:", claims.kernel_missing() or "loaded")

# %% [markdown]
# ## 1. Cells through the block table
#
# The engine hands the kernel each row's block ids (the step's block table, -1 past the row's
# end) and its length. Token `t` is in cell `blocks[t // bs] * bs + t % bs`; the kernel
# computes that itself and reads the head's D-vector there.

# %%
blocks, length, bs = [7, 2], 6, 4
for t, cell in enumerate(snap.cells_of(blocks, length, bs)):
    print(f"token {t}: block {blocks[t // bs]}, offset {t % bs} -> cell {cell}")

# %% [markdown]
# ## 2. One task, tile by tile
#
# One row of 300 tokens, one KV head with a group of 3 query heads. The task scores 16 tokens
# at a time; after each tile the running max can rise, and the sum and the accumulator are
# rescaled by `exp(m_old - m_new)`. At the end `acc / l` is the softmax-weighted sum of V.

# %%
q, kp, vp, table, ctx = claims.case([300], 16, 1, 3, 64, seed=1)
counts = snap.Counts()
m, lsum, acc = snap.attend_split(q[0], kp, vp, table[0], 16, 0, 0, 300, 64 ** -0.5, counts)
cells = torch.tensor(snap.cells_of(table[0].tolist(), 300, 16))
scores = (q[0] @ kp[cells, 0].T) * 64 ** -0.5  # (3, 300): what the task never holds at once
plain = torch.softmax(scores, -1) @ vp[cells, 0]
print(f"{counts.tiles} tiles, {counts.k_rows} K vectors fetched for {q.shape[1]} query heads")
print("running max per head:", [f"{x:.3f}" for x in m.tolist()],
      " plain max:", [f"{x:.3f}" for x in scores.amax(1).tolist()])
print(f"acc / l vs a plain softmax: {(acc / lsum[:, None] - plain).abs().max():.1e}")

# %% [markdown]
# ## 3. Splits and the combine
#
# A 2,000-token row is 4 splits of 512 tokens per KV head: tasks that two cores can share.
# Each split leaves its own max `m_s`, sum `l_s` and unnormalised accumulator; the combine
# rescales each to the row's largest max and divides once.

# %%
q, kp, vp, table, ctx = claims.case([2000], 16, 3, 3, 64, seed=2)
print("task grid (rows, KV heads, splits):", snap.task_grid(1, 3, [2000]))
parts = [snap.attend_split(q[0, 0:3], kp, vp, table[0], 16, 0, lo, min(2000, lo + 512),
                           64 ** -0.5, snap.Counts()) for lo in range(0, 2000, 512)]
for i, (m_s, l_s, _) in enumerate(parts):
    print(f"split {i}: m = {m_s[0].item():.3f}, l = {l_s[0].item():8.3f}  (head 0)")
merged = snap.combine(*(torch.stack(x) for x in zip(*parts, strict=True)))
out = claims.kernel(q, kp, vp, table, ctx, 16)
err = (merged - out[0, 0:3]).abs().max()
print(f"combined splits vs the compiled kernel (KV head 0): {err:.1e}")

# %% [markdown]
# ## 4. Kernel, frozen model and reference
#
# The claims' three configurations (GQA group, head_dim, block size), each over rows of 1, 37,
# 600 and 2,000 tokens with scrambled blocks. Then every cell no row owns is set to NaN: a read
# that touched one would spoil its row.

# %%
for cfg, f32, bf16, mine in zip(claims.CONFIGS, claims.errors("float32"),
                                claims.errors("bfloat16"), claims.model_errors(), strict=True):
    print(f"group {cfg[0]}, head_dim {cfg[1]}, block {cfg[2]:2d}: vs reference float32 "
          f"{f32:.1e}, bf16 {bf16:.1e}; frozen model vs kernel {mine:.1e}")
print("rows with a non-finite output, poisoned pool:", claims.poisoned())

# %% [markdown]
# ## 5. The engine
#
# nanoserve-tiny in float32: the reference read with the fused ops off, the kernel with them off
# and on, through a cramped pool (preemption) and a 256-token step budget (chunked prefill
# beside decodes, whose decode rows go through the kernel too).

# %%
print(claims.auto_choice())
print(claims.tokens())
print(claims.kernel_calls())

# %% [markdown]
# ## 6. Bytes and time
#
# Bytes: the package's `workspace_bytes` for the other reads, the snapshot's mirror of the
# kernel's allocations for this one. Time: one layer's read at SmolLM2-135M's heads, 8 rows of
# 2,000 tokens in bf16, three interleaved rounds on one thread (the claims take more).

# %%
print("ragged 2,000..10, reference / gathered / Triton / this kernel:",
      claims.workspace(claims.RAGGED))
print("  of which:", claims.kernel_bytes_parts(claims.RAGGED))
t = claims.read_times("bfloat16", 2000, rounds=3)
print({k: f"{v * 1e3:.2f} ms" for k, v in t.items()})
print(f"gathered / kernel {t['gathered'] / t['kernel']:.2f}x, "
      f"reference / kernel {t['reference'] / t['kernel']:.2f}x")
