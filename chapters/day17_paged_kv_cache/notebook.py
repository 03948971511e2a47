# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Day 17 notebook: the shipped model on a paged KV cache
#
# On a CPU, in a few seconds, with the live package and the shipped nanoserve-tiny model:
#
# 1. the cell arithmetic of a block table, and its two refusals;
# 2. two prompts whose blocks end up scattered through a small pool, out of order;
# 3. a `BatchedPagedKVCache` for the model: its pools, its slot table, each row's cells;
# 4. both prompts prefilled into their blocks, and the logits held against Day 7's contiguous
#    `KVCache`;
# 5. batched decode steps over both rows: the gathered (B, S) rectangle, blocks appended as the
#    rows grow, and the logits checked again at every step;
# 6. the same greedy tokens through the public `LLM` API, which runs on this cache;
# 7. the refusals at the edges, `reset_row`, and a held row that does not grow.

# %%
import pathlib
import sys

ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from nanoserve import LLM, SamplingParams
from nanoserve.attention.kv_cache import KVCache
from nanoserve.attention.paged import BatchedPagedKVCache, BlockTable
from nanoserve.engine.block_allocator import BlockAllocator
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error
from nanoserve.tokenizer import Tokenizer

torch.set_num_threads(2)
MODEL_DIR = ROOT / "nanoserve/checkpoints/nanoserve-tiny"

# %% [markdown]
# ## 1. A block table: token position to pool cell
#
# A block table is one sequence's block ids, in order. Token `p` lives in block
# `blocks[p // block_size]` at offset `p % block_size`, which is pool cell
# `blocks[p // block_size] * block_size + p % block_size`. The chapter's worked example:
# blocks `[7, 2, 9]`, block size 16, token 37.

# %%
t = BlockTable(block_size=16, capacity=8)
t.extend([7, 2, 9])
p = 37
block, offset = t.blocks[p // 16], p % 16
print(f"token {p}: block index {p} // 16 = {p // 16} -> block {block}, offset {p} % 16 = "
      f"{offset}, cell {block} * 16 + {offset} = {t.cells(p, p + 1)[0]}")
print("cells of tokens 30..35:", t.cells(30, 36), " <- a jump from block 2 to block 9 at 32")
print(f"the table addresses {t.num_slots} positions with {len(t)} blocks")

# %% [markdown]
# Two refusals: a table cannot grow past its capacity (`max_model_len` rounded up to whole
# blocks), and it cannot map a position that no block covers yet.

# %%
for label, call in [("extend by 6 more blocks", lambda: t.extend(list(range(6)))),
                    ("cells(40, 49)", lambda: t.cells(40, 49))]:
    try:
        call()
        print(f"{label}: accepted (!)")
    except ValueError as e:
        print(f"{label}: ValueError: {e}")

# %% [markdown]
# ## 2. Two prompts, scattered blocks
#
# An 8-block pool with block size 4 (tiny on purpose, so every cell can be printed). The history
# is the chapter's figure: an earlier request X holds blocks 0-2; A and B arrive and take what is
# free; X finishes; A and B each need one more block and get X's old ones. A's blocks end up
# out of order, B's far apart.

# %%
model = load_model(MODEL_DIR, "float32")
tok = Tokenizer.from_dir(MODEL_DIR)
cfg = model.cfg
prompts = {"A": "The while statement is used for repeated execution",
           "B": "The for statement is used to"}
ids = {name: tok.encode(text) for name, text in prompts.items()}
for name, i in ids.items():
    print(f"{name}: {len(i)} tokens  {prompts[name]!r}")

BS, NUM_BLOCKS, MAX_LEN = 4, 8, 16
pool = BlockAllocator(NUM_BLOCKS, BS)
x = pool.allocate(3)
held = {"A": pool.allocate(2), "B": pool.allocate(1)}
pool.free(x)
held["A"] += pool.allocate(pool.blocks_for_length(len(ids["A"])) - len(held["A"]))
held["B"] += pool.allocate(pool.blocks_for_length(len(ids["B"])) - len(held["B"]))
pool.check_invariants()
print(f"\nX held {x} and finished; A holds {held['A']}, B holds {held['B']}, "
      f"{pool.num_free} blocks free")

# %% [markdown]
# ## 3. The cache
#
# Rows are batch slots: row 0 for A, row 1 for B. The K and V pools are flat over cells, one
# pool per layer. The slot table is `(rows, max_model_len)` int64 on the model's device, -1
# wherever nothing is mapped yet.

# %%
cache = BatchedPagedKVCache.for_model(model, num_blocks=NUM_BLOCKS, block_size=BS,
                                      max_num_seqs=2, max_model_len=MAX_LEN)
ROW = {"A": 0, "B": 1}
for name, row in ROW.items():
    cache.tables[row].extend(held[name])
print("k pool      ", tuple(cache.k.shape), "  # (L, cells, Hkv, D)")
print("v pool      ", tuple(cache.v.shape))
print("slot table  ", tuple(cache.slots.cells.shape), cache.slots.cells.dtype)
print(f"KV bytes     {cache.nbytes():,}  (slot table {cache.slots.cells.nbytes:,})")
print("tables      ", [tb.blocks for tb in cache.tables], " capacity",
      cache.tables[0].capacity, "blocks each")

# %% [markdown]
# ## 4. Prefill each prompt into its blocks
#
# One forward per row. `begin_step(rows, num_new)` computes the new tokens' cells from the
# block table, writes them into the slot table, and lays out the step; the model's forward is
# Day 7's, unchanged, with the paged cache passed where the contiguous one went; `end_step`
# moves the row's length on. Next to each row runs Day 7's contiguous cache with the same
# tokens, as the reference.

# %%
contiguous = {name: KVCache.for_model(model, batch=1, max_len=MAX_LEN) for name in ROW}
last = {}
with torch.inference_mode():
    for name, row in ROW.items():
        toks = torch.tensor([ids[name]])  # (1, T)
        pos = torch.arange(len(ids[name]))[None]  # (1, T)
        cache.begin_step([row], [len(ids[name])])
        paged_logits = model.compute_logits(model(toks, pos, cache)[0, -1])  # (V,)
        cache.end_step()
        ref = model.compute_logits(model(toks, pos, contiguous[name])[0, -1])
        contiguous[name].advance(len(ids[name]))
        last[name] = paged_logits
        print(f"row {row} ({name}): length {cache.lengths[row]:2d}, cells "
              f"{cache.tables[row].cells(0, cache.lengths[row])}")
        print(f"   max |paged - contiguous| = {(paged_logits - ref).abs().max():.2e}, "
              f"relative {relative_logit_error(paged_logits, ref):.2e}")

print("\nslot table:\n", cache.slots.cells)

# %% [markdown]
# Token 9 of A sits in block `held["A"][2]` at offset 1. Its keys, in every layer, are in that
# pool cell, and they are the same numbers the contiguous cache keeps at position 9.

# %%
cell = cache.tables[0].cells(9, 10)[0]
print(f"A's token 9 -> cell {cell}")
same = torch.equal(cache.k[:, cell], contiguous["A"].k[:, 0, :, 9])  # (L, Hkv, D) each
print("pool k[:, cell] equals the contiguous cache's k at position 9:", same)

# %% [markdown]
# ## 5. Batched decode over both rows
#
# Each step feeds both rows one token, in one forward. A row whose next position falls past its
# last block first gets one more block from the pool (the engine's `grant` does the same). The
# first step's layout shows the rectangle: `read_cells` is `(B, S)` with `S` the longer context,
# and B's extra columns are -1, gathered from cell 0 and masked.

# %%
STEPS = 6
seqs = {name: list(i) for name, i in ids.items()}
nxt = {name: int(last[name].argmax()) for name in ROW}
worst = 0.0
with torch.inference_mode():
    for step in range(STEPS):
        for name, row in ROW.items():
            need = pool.blocks_for_length(cache.lengths[row] + 1) - len(cache.tables[row])
            if need > 0:
                got = pool.allocate(need)
                cache.tables[row].extend(got)
                print(f"step {step}: row {row} ({name}) reaches position {cache.lengths[row]}"
                      f" and gets block {got}")
        rows = list(ROW.values())
        toks = torch.tensor([[nxt[n]] for n in ROW])  # (B, 1)
        pos = torch.tensor([[cache.lengths[r]] for r in rows])  # (B, 1)
        layout = cache.begin_step(rows, [1, 1])
        if step == 0:
            print("write_cells ", layout.write_cells.tolist(), "  # (B, T)")
            print("read_cells   (B, S) =", tuple(layout.read_cells.shape))
            print(layout.read_cells)
            print("context_lens", layout.context_lens.tolist())
        logits = model.compute_logits(model(toks, pos, cache)[:, -1])  # (B, V)
        cache.end_step()
        for b, name in enumerate(ROW):
            ref = model.compute_logits(
                model(toks[b:b + 1], pos[b:b + 1], contiguous[name])[0, -1])
            contiguous[name].advance(1)
            worst = max(worst, relative_logit_error(logits[b], ref))
            seqs[name].append(nxt[name])
            nxt[name] = int(logits[b].argmax())
print(f"\n{STEPS} batched steps: worst relative logit difference, paged vs contiguous: "
      f"{worst:.2e}")
print("lengths", cache.lengths, " tables", [tb.blocks for tb in cache.tables],
      f" free blocks {pool.num_free}")
pool.check_invariants()

# %% [markdown]
# Prefilled one row at a time, the paged logits were bitwise equal to the contiguous ones. In a
# batch of two they differ in the last bits (a few 1e-7, relative): the forward now multiplies
# (2, ...) tensors and attends over a rectangle of width S, so floating-point sums are grouped
# differently. The same tokens come out; the chapter's bound is 1e-5.
#
# The slot table now maps every position of both rows; A's row is full (16 of 16 positions).

# %%
print(cache.slots.cells)
for name in ROW:
    new = seqs[name][len(ids[name]):] + [nxt[name]]
    print(f"{name}: {prompts[name]!r} -> {tok.decode(new)!r}")

# %% [markdown]
# ## 6. The same tokens through `LLM`
#
# The public API runs on this cache too, with its own pool (block size 16, the default). Greedy
# decoding should give the same tokens as the hand-driven loop above: 1 from each prefill and 6
# from the decode steps.

# %%
llm = LLM(MODEL_DIR, dtype="float32")
kv = llm.core.scheduler.kv_cache_manager  # the scheduler's blocks
print("LLM's cache:", type(llm.engine.cache).__name__, "with", kv.num_blocks, "blocks of",
      kv.block_size)
outs = llm.generate(list(prompts.values()),
                    SamplingParams(temperature=0, max_tokens=STEPS + 1, ignore_eos=True))
for name, out in zip(ROW, outs, strict=True):
    mine = seqs[name][len(ids[name]):] + [nxt[name]]
    print(f"{name}: LLM {out.token_ids}\n   here {mine}   same: {out.token_ids == mine}")

# %% [markdown]
# ## 7. The edges
#
# Row A is at `max_model_len`; the pool has no free block; A's table is at capacity. Each of
# these is refused with a message, and nothing changes.

# %%
for label, call in [("begin_step one more token on row 0", lambda: cache.begin_step([0], [1])),
                    ("allocate(1) from the full pool", lambda: pool.allocate(1)),
                    ("append a 5th block to row 0", lambda: cache.tables[0].append(7))]:
    try:
        call()
        print(f"{label}: accepted (!)")
    except ValueError as e:
        print(f"{label}: ValueError: {e}")

# %% [markdown]
# `reset_row` forgets a row (length 0, slot-table row back to -1) and returns its blocks, which
# go straight back to the allocator. The K/V in those cells is not cleared: nothing maps them
# any more, and the next owner overwrites them.

# %%
freed = cache.reset_row(1)
pool.free(freed)
pool.check_invariants()
print(f"row 1 returned {freed}; pool has {pool.num_free} free; lengths {cache.lengths}")
print("slot row 1:", cache.slots.cells[1].tolist())

# %% [markdown]
# Finally `hold`: a row in the hold set writes its token at its current length and does not
# grow. It is meant for a row that has finished but must stay in its batch until the whole
# batch ends: the row keeps being computed, in place, without needing more blocks.

# %%
cache.tables[1].extend(pool.allocate(2))
with torch.inference_mode():
    cache.begin_step([1], [len(ids["B"])])
    model(torch.tensor([ids["B"]]), torch.arange(len(ids["B"]))[None], cache)
    cache.end_step()
    for _ in range(3):
        cache.begin_step([1], [1], hold=frozenset({1}))
        model(torch.tensor([[nxt["B"]]]), torch.tensor([[cache.lengths[1]]]), cache)
        cache.end_step()
print(f"row 1 after a 7-token prefill and 3 held steps: length {cache.lengths[1]}, "
      f"blocks {cache.tables[1].blocks}")
