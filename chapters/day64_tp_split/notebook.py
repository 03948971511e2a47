# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 64 notebook: cutting a Llama over ranks
#
# Tensor parallelism gives each rank a slice of every large weight and has the ranks meet twice
# a layer, at an all-reduce. Most of this notebook needs no second process. The cut is decided
# from `config.json` alone, the slices are read straight from the safetensors file, and the
# arithmetic that makes the cut correct can be run in one process with plain torch. The last
# section starts a real worker. In well under a minute on a CPU:
#
# 1. the plans for nanoserve-tiny over 2 and 8 ranks, SmolLM2-135M's shape over 2 (its KV heads
#    split unevenly), and a vocabulary that needs padding;
# 2. one rank's slices of the shipped checkpoint beside the full tensors, and the bytes it read;
# 3. the column-then-row split of an MLP, summed by hand, and the row-parallel bias;
# 4. the vocabulary-parallel embedding and the gathered, trimmed logits;
# 5. a shape the loader refuses before any worker starts;
# 6. the shipped model through `tensor_parallel_size=2` and through one rank, token by token.

# %%
import multiprocessing
import os
import pathlib
import sys
import time
from dataclasses import replace

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

# Section 6 spawns a worker process, and a spawned process runs this file again, as
# "__mp_main__", to find the module it was started from. Its copy of the cells prints nothing.
if __name__ == "__mp_main__":
    sys.stdout = open(os.devnull, "w")  # for the worker's whole life

import torch
import torch.nn.functional as F
from safetensors import safe_open

from chapters.common import SHIPPED
from chapters.day64_tp_split.snapshot.shard import Shape, plan
from nanoserve import LLM, SamplingParams
from nanoserve.bench.shapes import shape_config
from nanoserve.config import ModelConfig
from nanoserve.tp.load import read_slices
from nanoserve.tp.shard import LAYER_SPLIT, ShardPlan

tiny = ModelConfig.from_dir(SHIPPED)
smol = ModelConfig.from_dict(shape_config("smollm2-135m"))  # the published config; no weights

# %% [markdown]
# ## 1. The plans
#
# `ShardPlan(cfg, tp, rank)` needs the model's shape and nothing else. nanoserve-tiny has 8
# query heads over 4 KV heads, an MLP of 688 columns and 2048 vocabulary rows; over 2 ranks
# everything halves.

# %%
def show(cfg: ModelConfig, tp: int) -> None:
    for r in range(tp):
        p = ShardPlan(cfg, tp, r)
        print(" ", p.describe())
        print(f"    query heads {p.q_heads}, KV heads {p.kv_heads}, local config: "
              f"{p.local.num_attention_heads} heads, {p.local.num_key_value_heads} KV heads, "
              f"MLP {p.local.intermediate_size}, vocabulary shard {p.local.vocab_size}")


print("nanoserve-tiny over 2 ranks:")
show(tiny, 2)

# %% [markdown]
# SmolLM2-135M has 9 query heads over 3 KV heads. Whole heads go out as evenly as they can, so
# rank 0 (which also runs the scheduler and the sampler) takes 1 KV head and its 3 query heads,
# and rank 1 takes the other 2 and their 6. The MLP and the vocabulary still halve.

# %%
print("SmolLM2-135M's shape over 2 ranks:")
show(smol, 2)
frozen = [plan(Shape.of(shape_config("smollm2-135m")), 2, r) for r in (0, 1)]
print("the frozen snapshot says:", [(f.q, f.kv) for f in frozen])

# %% [markdown]
# Over 8 ranks nanoserve-tiny has fewer KV heads than ranks. Each rank gets one query head, and
# the KV head that query head reads is replicated on both ranks of its group.

# %%
plans8 = [ShardPlan(tiny, 8, r) for r in range(8)]
for p in plans8:
    print(f"  rank {p.rank}: query head {p.q_heads[0]}, KV head {p.kv_heads[0]}, "
          f"replicated {p.replicated_kv}")

# %% [markdown]
# A vocabulary the ranks do not divide: each rank's shard has `ceil(V / tp)` rows, and the
# last rank's ends in zero rows. Here nanoserve-tiny's shape with a 255-row vocabulary, as in
# the chapter's grid of shapes.

# %%
odd = replace(tiny, vocab_size=255)
for r in range(2):
    p = ShardPlan(odd, 2, r)
    print(f"  rank {r}: vocabulary rows {p.vocab_rows}, shard of {p.local.vocab_size} rows, "
          f"{p.vocab_pad} of them padding")

# %% [markdown]
# ## 2. One rank's slices, read from the file
#
# `read_slices` opens every tensor with `safe_open(...).get_slice(name)` and reads only the
# piece `ShardPlan.take` asks for. Column-parallel weights (q, k, v, gate, up) lose rows,
# row-parallel ones (o, down) lose columns, norms come whole, and the embedding loses rows of
# the vocabulary.

# %%
plan0 = ShardPlan(tiny, 2, 0)
mine, nbytes = read_slices(SHIPPED, plan0)
SIZE = {"F32": 4, "BF16": 2, "F16": 2}  # bytes per element, by safetensors dtype
with safe_open(SHIPPED / "model.safetensors", framework="pt") as f:  # shapes only, no data
    full = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    total = sum(torch.Size(full[n]).numel() * SIZE[f.get_slice(n).get_dtype()] for n in full)

for name in sorted(full):
    if name.startswith("model.layers.") and not name.startswith("model.layers.0."):
        continue  # layer 0 stands for all four
    part = name.split(".", 3)[3].rpartition(".")[0] if name.startswith("model.layers.") else ""
    how = LAYER_SPLIT.get(part, "vocabulary rows" if "embed" in name else "whole")
    print(f"  {name:48s} {str(full[name]):12s} -> {str(tuple(mine[name].shape)):12s} {how}")
print(f"rank 0 read {nbytes:,} of {total:,} bytes ({nbytes / total:.1%})")

# %% [markdown]
# ## 3. Column, then row, by hand
#
# An MLP small enough to print, cut over 2 ranks. Gate and up are column-parallel (each rank
# holds some of the MLP's columns as rows of the weights); down is row-parallel (the matching
# columns of its weight). Each rank runs the whole MLP on its slice, and its output has the
# full (T, E) shape but is only a partial sum. Adding the partials is what the all-reduce does.

# %%
torch.manual_seed(0)
T, E, M, TP = 3, 16, 24, 2  # tokens, hidden size, MLP width, ranks
x = torch.randn(T, E, dtype=torch.float64)
gate, up = torch.randn(M, E, dtype=torch.float64), torch.randn(M, E, dtype=torch.float64)
down = torch.randn(E, M, dtype=torch.float64)


def mlp(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)  # (T, E)


whole = mlp(x, gate, up, down)
cols = [slice(r * M // TP, (r + 1) * M // TP) for r in range(TP)]
partials = [mlp(x, gate[c], up[c], down[:, c]) for c in cols]  # what each rank computes
print("each partial has shape", tuple(partials[0].shape))
print("rank 0's partial alone, max |error|:", f"{(partials[0] - whole).abs().max():.3g}")
print("sum over ranks, max |error|:       ", f"{(sum(partials) - whole).abs().max():.3g}")

# %% [markdown]
# SiLU-and-multiply is elementwise, so it runs on each rank's columns with nothing exchanged.
# The same holds for attention, head by head. Between the column-parallel linear and the
# row-parallel one the ranks never meet; after it they meet once.
#
# Now give down a bias. It belongs to the full output, so if every rank added it to its partial
# sum, the all-reduce would add it `TP` times. The plan gives it to rank 0 and zeros to the rest.

# %%
bias = torch.randn(E, dtype=torch.float64)
with_bias = whole + bias
everyone = sum(p + bias for p in partials)
rank0_only = sum(p + (bias if r == 0 else torch.zeros_like(bias))
                 for r, p in enumerate(partials))
print("bias on every rank, max |error|:", f"{(everyone - with_bias).abs().max():.3g}")
print("bias on rank 0,     max |error|:", f"{(rank0_only - with_bias).abs().max():.3g}")

# %% [markdown]
# ## 4. The vocabulary over ranks
#
# A 10-row table over 4 ranks: `ceil(10 / 4) = 3` rows each, the last rank's shard holding one
# real row and two zero rows. Each rank looks up only the ids in its rows and writes zeros
# elsewhere; the sum over ranks is the ordinary lookup. The LM head is the same shard used the
# other way round: each rank's logits cover its rows, rank 0 joins them and drops the padding.

# %%
V, TPV = 10, 4
table = torch.randn(V, E, dtype=torch.float64)
n = -(-V // TPV)
padded = torch.cat([table, table.new_zeros(n * TPV - V, E)])
shards = [padded[r * n:(r + 1) * n] for r in range(TPV)]
ids = torch.tensor([0, 4, 9, 7, 3])


def lookup(ids, shard, start):  # what VocabParallelEmbedding does before its all-reduce
    local = ids - start
    outside = (local < 0) | (local >= len(shard))
    out = F.embedding(local.masked_fill(outside, 0), shard)
    return out.masked_fill(outside[:, None], 0)


summed = sum(lookup(ids, s, r * n) for r, s in enumerate(shards))
print("lookup summed over ranks == table[ids]:", torch.equal(summed, table[ids]))
h = torch.randn(2, E, dtype=torch.float64)
gathered = torch.cat([F.linear(h, s) for s in shards], dim=-1)  # (2, n * TPV) on rank 0
print("gathered logits", tuple(gathered.shape), "-> trimmed", tuple(gathered[:, :V].shape),
      "; equal to h @ table.T:", torch.allclose(gathered[:, :V], h @ table.T))
print("the padding's logits are", gathered[:, V:].tolist(), "and must not be sampled")

# %% [markdown]
# ## 5. A shape the loader refuses
#
# nanoserve-tiny's MLP has 688 columns, which 3 ranks do not divide. The loader builds rank 0's
# plan before it reads the tokenizer or starts anything, so the refusal comes at once, in this
# process, and no worker is left behind.

# %%
t0 = time.perf_counter()
try:
    LLM(dtype="float32", tensor_parallel_size=3)
except ValueError as e:
    print(f"ValueError after {time.perf_counter() - t0:.2f} s: {e}")
print("worker processes alive:", multiprocessing.active_children())
try:
    ShardPlan(tiny, 6, 0)
except ValueError as e:
    print("tp=6:", e)

# %% [markdown]
# ## 6. Two ranks against one
#
# The shipped model in float32, greedy, through one rank and then through two. The second
# `LLM` spawns one worker process over gloo on 127.0.0.1, so it is built under the `__main__`
# guard (the worker runs this file again, see the first cell) and in a `with` block, which
# stops the worker at its end. In a Jupyter kernel `__name__` is `"__main__"` too.

# %%
PROMPTS = ["The while statement", "Once upon a time there was", "def f(x):", "A list is",
           "import os\nimport sys\n", "class Stack:", "The quick brown fox jumps over", "x = 1"]
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def main() -> None:
    one = [o.token_ids for o in LLM(dtype="float32").generate(PROMPTS, GREEDY)]
    with LLM(dtype="float32", tensor_parallel_size=2) as llm:
        print(llm.model.shard_plan.describe())
        print(f"rank 0 read {llm.model.bytes_read:,} bytes of the checkpoint")
        outs = llm.generate(PROMPTS, GREEDY)
    two = [o.token_ids for o in outs]
    for p, a, b, o in zip(PROMPTS, one, two, outs, strict=True):
        print(f"  {'same' if a == b else 'DIFFERENT':9s} {p!r:34} -> {o.text[:40]!r}")
    print(f"{sum(a == b for a, b in zip(one, two, strict=True))} of {len(PROMPTS)} identical; "
          f"workers alive afterwards: {multiprocessing.active_children()}")


if __name__ == "__main__":
    main()
