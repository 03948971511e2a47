# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 50 notebook: each row reads its own context
#
# In about half a minute on a CPU, this notebook:
#
# 1. prices the two decode reads with `workspace_bytes` for a few batches;
# 2. builds a small ragged batch in a real cache and prints the rectangle and the chunk list
#    that one decode step reads;
# 3. walks one row through a reset and a rejoin and watches the index drop and re-add it;
# 4. checks the gathered read against the reference, logits and greedy tokens, in float32;
# 5. times the two reads on a ragged batch.

# %%
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day50_gathered_mapping import claims
from nanoserve import LLM, SamplingParams
from nanoserve.attention.backends.gathered import paged_attention_gathered
from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.attention.reference import paged_attention_batched_reference
from nanoserve.attention.selector import workspace_bytes

torch.set_num_threads(1)

# %% [markdown]
# ## 1. What each read materialises
#
# One layer, one query per row, SmolLM2-135M's heads (9 query, 3 KV, head size 64), bf16.

# %%
for name, lens in [("one of 2000 + 31 of 50", [2000] + [50] * 31),
                   ("one of 500 + 7 of 10", [500] + [10] * 7),
                   ("32 of 16..202", list(range(16, 208, 6))), ("32 of 512", [512] * 32)]:
    ref, got = (workspace_bytes(p, lens, 9, 3, 64, 2) for p in ("reference", "gathered"))
    print(f"{name:24s} reference {ref / 2**20:7.2f} MiB   gathered {got / 2**20:6.2f} MiB   "
          f"ratio {ref / got:5.1f}x")

# %% [markdown]
# ## 2. One decode step, both layouts
#
# A bare cache (1 layer, 2 KV heads, head size 8) with four rows of 3, 9, 2 and 5 tokens,
# block size 4 and `C = 32`. The rectangle is every row at the longest width; the chunk list
# has one chunk per row here, padded with `-1` only past each row's end.

# %%
def make_cache(attention, lengths):
    cache = BatchedPagedKVCache(1, 2, 8, 64, 4, len(lengths), 64, attention=attention)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0)).tolist()
    for r in range(len(lengths)):
        cache.tables[r].extend(perm[r * 8:(r + 1) * 8])
    g = torch.Generator().manual_seed(1)
    rows = list(range(len(lengths)))
    cache.begin_step(rows, lengths)  # the prefill writes every row's prompt
    q, k, v = (torch.randn(len(rows), h, max(lengths), 8, generator=g) for h in (4, 2, 2))
    pos = torch.tensor([[min(t, n - 1) for t in range(max(lengths))] for n in lengths])
    cache.attend(0, q, k, v, pos)
    cache.end_step()
    return cache, rows


lengths = [3, 9, 2, 5]
ref_cache, rows = make_cache("reference", lengths)
gat_cache, _ = make_cache("gathered", lengths)
ref_step = ref_cache.begin_step(rows, [1] * 4)
gat_step = gat_cache.begin_step(rows, [1] * 4)
print("rectangle read_cells (B, S):\n", ref_step.read_cells)
cells, chunk_b = gat_step.read[:2]  # the step's cells and each chunk's row (then its
# first position, which only a sliding window reads)
print("gathered cells (n, C), first 12 columns:\n", cells[:, :12], "\nchunk_b:", chunk_b)
g = torch.Generator().manual_seed(2)
q, k, v = (torch.randn(4, h, 1, 8, generator=g) for h in (4, 2, 2))
pos = torch.tensor([[n] for n in lengths])
a, b = ref_cache.attend(0, q, k, v, pos), gat_cache.attend(0, q, k, v, pos)
ref_cache.end_step()
gat_cache.end_step()
print(f"max |difference| of the two reads: {(a - b).abs().max():.1e}")

# %% [markdown]
# ## 3. A reset, then a rejoin
#
# Resetting row 1 only marks it stale; its chunk goes at the next step. When the row comes
# back with a new prompt it is appended whole, once.

# %%
index = gat_cache.backend.index  # the gathered backend keeps the mapping
print("before:", index.n, "chunks, rebuilt_rows", index.rebuilt_rows, "appended_cells",
      index.appended_cells)
gat_cache.reset_row(1)
print("after reset_row(1): stale", index.stale, "- chunks still", index.n)
gat_cache.begin_step([0, 2, 3], [1] * 3)
gat_cache.end_step()
print("next step without row 1: chunks", index.n, "rows", index.chunk_row[:index.n].tolist())
gat_cache.tables[1].extend([60, 61])
gat_cache.begin_step([1], [4])  # row 1's new prompt, 4 tokens
gat_cache.end_step()
gat_cache.begin_step([0, 1, 2, 3], [1] * 4)
gat_cache.end_step()
print("row 1 back: chunks", index.n, "rows", index.chunk_row[:index.n].tolist(),
      "rebuilt_rows", index.rebuilt_rows, "appended_cells", index.appended_cells)

# %% [markdown]
# ## 4. Against the reference: logits and tokens
#
# The frozen snapshot over Day 17's cache, both reads, four ragged rows for forty steps; then
# the package's `LLM` with each read on text prompts, in float32.

# %%
print(f"max |logit| difference, snapshot: {claims.logit_difference():.1e}")
prompts = ["Once upon a time", "The little cat sat on the", "Hi",
           "In a small village there lived an old man who had", "Why", "The for statement"]
params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
texts = {}
for attention in ("reference", "gathered"):
    llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, attention=attention)
    texts[attention] = [o.text for o in llm.generate(prompts, params)]
for r, g_ in zip(texts["reference"], texts["gathered"], strict=True):
    print(f"{'same' if r == g_ else 'DIFFERENT':9s} {g_!r}")

# %% [markdown]
# ## 5. Time the two reads on a ragged batch
#
# One layer of the one-of-2000 batch, float32, ten calls a round, interleaved.

# %%
q, kp, vp, rect, cells, chunk_b = claims.ragged_read(claims.BATCHES["ragged"])
ctx = torch.tensor(claims.BATCHES["ragged"])
best = {"reference": float("inf"), "gathered": float("inf")}
with torch.inference_mode():
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(10):
            paged_attention_batched_reference(q[:, :, None], kp, vp, rect, (ctx - 1)[:, None],
                                              ctx)
        best["reference"] = min(best["reference"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(10):
            paged_attention_gathered(q, kp, vp, cells, chunk_b)
        best["gathered"] = min(best["gathered"], time.perf_counter() - t0)
print(f"reference {best['reference'] * 100:.1f} ms a call, gathered "
      f"{best['gathered'] * 100:.2f} ms a call: {best['reference'] / best['gathered']:.1f}x")
