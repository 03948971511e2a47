# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 60 notebook: the paged decode kernel
#
# The reference gathers a (B, S) rectangle, S the longest row, before it scores anything. The
# kernel runs one program per (row, KV head) and reads each row through its own block ids, a
# tile at a time, with the softmax kept online. On this CPU (no GPU) the kernel runs under
# Triton's interpreter, in float32, which is slow but exact enough to check. In about ten
# seconds:
#
# 1. one row's cells, read through its block ids;
# 2. one program's online softmax, tile by tile, against a plain softmax;
# 3. the kernel and the frozen snapshot against the reference, on ragged rows;
# 4. poison: NaN in every cell no row owns;
# 5. the launch grid and the bytes each read materialises, at Llama-3.2-1B's shape.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day60_paged_kernel.claims import (
    Launches,
    case,
    llama_inputs,
    reference,
    rel,
    workspace,
)
from chapters.day60_paged_kernel.snapshot import online
from nanoserve.cuda.kernels import paged_attention

torch.set_num_threads(1)

# %% [markdown]
# ## 1. Cells through block ids
#
# A row's block table names the pool blocks it owns, in order. Position `p` lives at
# `blocks[p // block_size] * block_size + p % block_size`. The kernel computes this itself,
# in int64, instead of being handed a rectangle of cells.

# %%
blocks, length, bs = [7, 2], 6, 4
for p, cell in enumerate(online.cells_of(blocks, length, bs)):
    print(f"position {p}: block {blocks[p // bs]} offset {p % bs} -> cell {cell}")

# %% [markdown]
# ## 2. One program, tile by tile
#
# Four query heads that share one KV head, 40 positions, 16-token tiles. The running max
# rises as tiles arrive and the running sum is rescaled each time it does; the final output
# equals an ordinary softmax over all 40 scores.

# %%
g = torch.Generator().manual_seed(60)
G, D, n = 4, 32, 40
q = torch.randn(G, D, generator=g)
k_pool, v_pool = torch.randn(n, 1, D, generator=g), torch.randn(n, 1, D, generator=g)
ids = torch.arange(n // bs)  # blocks 0..9, in order, for this example
scale = D ** -0.5 * online.LOG2E
m, lsum = torch.full((G,), float("-inf")), torch.zeros(G)
for start in range(0, n, 16):
    tok = torch.arange(start, min(start + 16, n))
    s = (q @ k_pool[tok, 0].T) * scale
    m_new = torch.maximum(m, s.amax(1))
    lsum = lsum * torch.exp2(m - m_new) + torch.exp2(s - m_new[:, None]).sum(1)
    m = m_new
    print(f"tile {start:2d}-{tok[-1]:2d}: running max {m[0]:.3f}, running sum {lsum[0]:.3f}")
out, lse = online.one_program(q, k_pool, v_pool, 0, ids, 0, n, bs, 16)
plain = torch.softmax(q @ k_pool[:, 0].T * D ** -0.5, -1) @ v_pool[:, 0]
print("online vs plain softmax, max relative error:", f"{rel(out, plain):.1e}")

# %% [markdown]
# ## 3. The kernel, the snapshot and the reference
#
# Three rows of 1, 13 and 53 tokens (16-token blocks, scattered, -1 past each row's end), GQA
# 2, head_dim 48: a head size that pads to 64 lanes inside the kernel.

# %%
q, k, v, tables, cells, ctx = case([1, 13, 53], 16, 2, 2, 48)
print("block tables:\n", tables)
ref = reference(q, k, v, cells, ctx)
out = paged_attention(q, k, v, tables, ctx, 16, splits=1, tile=16)
mine = online.paged_attention_online(q, k, v, tables, ctx, 16, tile=16)
print(f"kernel vs reference {rel(out, ref):.1e}, snapshot vs kernel {rel(mine, out):.1e}")

# %% [markdown]
# ## 4. Poison what should not be read
#
# Every pool cell that no row owns is set to NaN. The kernel never loads one. The reference
# turns each row's -1 entries into cell 0 and loads them, so its shorter rows come out NaN
# even though the mask removed those positions from the softmax.

# %%
q, k, v, tables, cells, ctx = case([3, 9, 14], 4, 2, 2, 32, poison=True)
out = paged_attention(q, k, v, tables, ctx, 4, splits=1, tile=16)
ref = reference(q, k, v, cells, ctx)
for r in range(3):
    print(f"row {r} ({int(ctx[r])} tokens): kernel finite {bool(torch.isfinite(out[r]).all())}, "
          f"reference finite {bool(torch.isfinite(ref[r]).all())}")

# %% [markdown]
# ## 5. At Llama-3.2-1B's shape
#
# A recorder stands in for the kernel object, so a 64-row, 1,024-token launch is built and not
# run: its grid and its constexprs (the GQA group and its padded tile rows, head_dim and its
# padded lanes). Then the bytes each read materialises for that step, per layer.

# %%
with Launches(run=False) as rec:
    paged_attention(*llama_inputs((1024,) * 64), 16)
(name, grid, c, seg, _), = rec.log
print(f"{name} grid {grid}: {grid[0] * grid[1] * grid[2]} programs; "
      f"G={c['G']} in {c['G_PAD']} tile rows, D={c['D']} in {c['D_PAD']} lanes")
for path in ("reference", "gathered", "triton"):
    print(f"{path:9s} {workspace(path, [1024] * 64):>12,} bytes")
