# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 51 notebook: many prompts, one stream
#
# Packed prefill lays a batch of prompts end to end in one (1, N) token stream instead of
# padding them into a (B, T) rectangle. In about fifteen seconds on a CPU, with the shipped
# nanoserve-tiny model in float32:
#
# 1. three sentences packed by the frozen snapshot: ids, positions and pool cells;
# 2. the block-diagonal mask those boundaries imply, and the loop that avoids building it;
# 3. the chapter's eight prompts through the live engine, packed and padded: counters, logits,
#    greedy tokens;
# 4. a row with tokens already cached, continued in the same packed step as a fresh prompt;
# 5. packed against padded, timed, on a ragged batch and on a batch of equal lengths.

# %%
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED, best_of
from chapters.day01_llama_forward.snapshot.weights import load_model as snapshot_model
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day51_packed_prefill.snapshot.packed import block_diagonal_mask, pack
from nanoserve import LLM, SamplingParams
from nanoserve.engine.engine import Engine
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error
from nanoserve.tokenizer import Tokenizer

torch.set_num_threads(1)
tok = Tokenizer.from_dir(SHIPPED)
model = load_model(SHIPPED, "float32")

# %% [markdown]
# ## 1. Three prompts, packed
#
# Each token keeps three things: its id, its position in its own sequence (restarting at every
# prompt) and the pool cell its K and V go to, found through its own row's block table. The
# snapshot's `pack` builds them on a Day 17 paged cache with block size 4; rows 0, 1 and 2
# are handed blocks in a shuffled order, so the cells are visibly scattered.

# %%
short = ["A tuple is immutable.", "The import statement loads a module.", "Use a set."]
ids3 = [tok.encode(s, add_special_tokens=False) for s in short]
snap = snapshot_model(SHIPPED)
cache = BatchedPagedKVCache.for_model(snap, 16, 4, 3, 64)
order = torch.randperm(16, generator=torch.Generator().manual_seed(51)).tolist()  # block ids
for row, p in enumerate(ids3):
    need = -(-len(p) // 4)  # blocks of 4 tokens
    cache.tables[row].extend(order[:need])
    order = order[need:]
layout = pack(cache, [0, 1, 2], ids3)
print("seq_lens   ", layout.seq_lens)
print("ids        ", layout.ids.tolist()[0])
print("positions  ", layout.positions.tolist()[0])
print("write cells", layout.write_cells.tolist())
print("last token ", layout.last.tolist(), "(where each prompt's logits are read)")

# %% [markdown]
# ## 2. Which key each query may see
#
# Query `i` sees key `j` iff both belong to the same prompt and `j <= i`. Written as one mask
# it is block diagonal; the snapshot's `packed_attention` computes only the blocks, one causal
# attention per prompt.

# %%
mask = block_diagonal_mask(layout.seq_lens)
for i, row in enumerate(mask.int().tolist()):
    print(f"q{i:2d} " + "".join("#" if x else "." for x in row))
n = sum(layout.seq_lens)
print(f"\nscores: {sum(k * k for k in layout.seq_lens)} in the blocks, {n * n} in the mask")

# %% [markdown]
# ## 3. The chapter's eight prompts through the live engine
#
# Lengths 5, 12, 40, 3, 90, 17, 8 and 60, cut from one paragraph. The same `LLM`, changing only
# `prefill=`. One token each first, so that the counters show the prefill alone.

# %%
from chapters.day51_packed_prefill.claims import LENGTHS, TEXT
from chapters.day51_packed_prefill.claims import prompts as claim_prompts

words = tok.encode(TEXT, add_special_tokens=False)

prompts = [list(p) for p in claim_prompts()]  # slices of one paragraph of Python's docs
print("lengths:", [len(p) for p in prompts], "(asked:", LENGTHS, ")")
runs = {}
for policy in ("packed", "padded"):
    llm = LLM(SHIPPED, dtype="float32", prefill=policy, max_num_seqs=8, max_model_len=256)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    s = llm.stats
    print(f"prefill={policy}: {s.forward_passes} forward, positions computed "
          f"{s.positions_computed}, real tokens {s.tokens_computed}")
    runs[policy] = llm

# %% [markdown]
# First-token logits from the engine both ways, and greedy continuations. Token identity is
# only meaningful in float32; both engines were built with `dtype="float32"`.

# %%
logits = {}
for policy in ("packed", "padded"):
    e = Engine(model, 64, 16, 8, 256, prefill=policy)
    for row, n in enumerate(LENGTHS):
        e.grant(row, n)
    with torch.inference_mode():
        logits[policy] = e.prefill(list(range(8)), prompts)
worst = max(relative_logit_error(a, b)
            for a, b in zip(logits["packed"], logits["padded"], strict=True))
print(f"max relative logit difference, packed vs padded: {worst:.2e}")

params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
outs = {p: [o.token_ids for o in runs[p].generate(prompts, params)] for p in runs}
print("greedy tokens identical:", outs["packed"] == outs["padded"])
print(f"prompt 4 ({LENGTHS[4]} tokens) continues: {tok.decode(outs['packed'][4])!r}")

# %% [markdown]
# ## 4. Continuing a cached row in a packed step
#
# Row 0 first takes 6 tokens of a prompt; a later packed step brings its next 11 beside a fresh
# 4-token prompt in row 1. Row 0's positions start at 6 and it reads its first six keys from the
# pool. Both rows are held against a plain forward of the whole sequence.

# %%
long, fresh = words[:17], words[40:44]
e = Engine(model, 32, 4, 2, 64)
e.grant(0, len(long))
e.grant(1, len(fresh))
with torch.inference_mode():
    e.prefill([0], [long[:6]])
    got = e.prefill([0, 1], [long[6:], fresh])
    for row, seq in ((0, long), (1, fresh)):
        alone = model.compute_logits(model(torch.tensor([seq]), torch.arange(len(seq))[None]))
        print(f"row {row}: {len(seq)} tokens, relative difference to a plain forward "
              f"{relative_logit_error(got[row], alone[0, -1]):.2e}")

# %% [markdown]
# ## 5. What it buys, timed
#
# The two policies in alternating rounds on one thread, each keeping its best time. On the
# ragged batch packing removes two thirds of the positions. On eight prompts of 30 tokens it
# removes nothing, and the two should come out about even.

# %%
def timed_prefill(policy, batch):
    def once():
        eng = Engine(model, 256, 16, len(batch), 256, prefill=policy)
        for row, p in enumerate(batch):
            eng.grant(row, len(p))
        t = time.perf_counter()
        with torch.inference_mode():
            eng.prefill(list(range(len(batch))), batch)
        return time.perf_counter() - t
    return once


equal = [words[i:i + 30] for i in range(0, 80, 10)]
for name, batch in (("ragged 5..90", prompts), ("eight of 30", equal)):
    best = best_of(5, {p: timed_prefill(p, batch) for p in ("packed", "padded")}, lambda s: s)
    print(f"{name:13s} packed {best['packed'] * 1e3:6.1f} ms, padded "
          f"{best['padded'] * 1e3:6.1f} ms, padded / packed {best['padded'] / best['packed']:.2f}x")
