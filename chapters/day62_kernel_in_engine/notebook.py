# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 62 notebook: the kernel in the engine
#
# `LLM(..., attention="triton")` sends every decode step's attention through the paged kernel
# and keeps prompts on packed prefill. On this CPU (no GPU) the kernel runs under Triton's
# interpreter, in float32, so the model is the tiny `gqa` test checkpoint (written by
# transformers) and the run is short. In about fifteen seconds:
#
# 1. the same requests through both attention paths, under preemption: the tokens;
# 2. one decode step's block ids, beside the slot-table cells they come from;
# 3. where each step's attention went;
# 4. what a prompt would cost through the kernel.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from nanoserve.cuda.triton_mode import use_interpreter

use_interpreter()  # no CUDA here: Triton's interpreter, chosen before anything imports triton

import nanoserve.attention.backends.base
import nanoserve.cuda.kernels
from chapters.common import hf_checkpoint
from chapters.day62_kernel_in_engine.snapshot import engine_read
from nanoserve import LLM, SamplingParams

torch.set_num_threads(1)
PATH = hf_checkpoint("gqa")
PROMPTS = [[0, *range(3 + i, 9 + 3 * i)] for i in range(5)]
PARAMS = [SamplingParams(temperature=0, max_tokens=5 + i, ignore_eos=True) for i in range(5)]
ENGINE = dict(dtype="float32", skip_tokenizer_init=True, block_size=4, max_num_seqs=3,
              num_kv_blocks=9)

# %% [markdown]
# ## 1. Same requests, both paths
#
# Three slots and nine 4-token blocks for five requests: the scheduler preempts rows and
# recomputes them later. Greedy decoding makes the comparison exact.

# %%
outs = {}
for attention in ("reference", "triton"):
    llm = LLM(PATH, attention=attention, **ENGINE)
    outs[attention] = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    print(f"{attention:9s} preemptions {llm.stats.preemptions}, "
          f"decode steps {llm.stats.decode_steps}")
for i, (a, b) in enumerate(zip(outs["reference"], outs["triton"], strict=True)):
    print(f"request {i}: {a} {'==' if a == b else '!='} {b}")

# %% [markdown]
# ## 2. One decode step's block ids
#
# Wrap the kernel to look at what the engine hands it on the first decode step: the block ids,
# and the slot-table cells of the same rows. Each id is the cell at the block's first position
# divided by 4; -1 stays -1 past a row's end.

# %%
llm = LLM(PATH, attention="triton", **ENGINE)
cache, kernel, shown = llm.engine.cache, nanoserve.cuda.kernels.paged_attention, []


def look(q, k, v, blocks, ctx, bs, *a, **kw):
    if not shown:
        step = cache._step
        shown.append(True)
        print("rows", step.rows, "context", step.ctx)
        print("slot-table cells:\n", cache.slots.cells[step.rows, :max(step.ctx)])
        print("block ids handed to the kernel:\n", blocks)
        print("frozen snapshot agrees:", torch.equal(
            engine_read.block_ids(cache.slots.cells, step.rows, step.ctx, bs), blocks))
    return kernel(q, k, v, blocks, ctx, bs, *a, **kw)


nanoserve.cuda.kernels.paged_attention = look
try:
    llm.generate(PROMPTS[:3], PARAMS[:3])
finally:
    nanoserve.cuda.kernels.paged_attention = kernel

# %% [markdown]
# ## 3. Where each step's attention went
#
# Count the kernel's calls (and their query tokens) and packed prefill's, over the full run.

# %%
counts = {"kernel": 0, "kernel, T > 1": 0, "packed prefill": 0}
packed = nanoserve.attention.backends.base.packed_prefill_attention


def count_kernel(q, *a, **kw):
    counts["kernel"] += 1
    counts["kernel, T > 1"] += q.shape[2] > 1
    return kernel(q, *a, **kw)


def count_packed(*a, **kw):
    counts["packed prefill"] += 1
    return packed(*a, **kw)


nanoserve.cuda.kernels.paged_attention = count_kernel
nanoserve.attention.backends.base.packed_prefill_attention = count_packed
try:
    LLM(PATH, attention="triton", **ENGINE).generate(PROMPTS, PARAMS)
finally:
    nanoserve.cuda.kernels.paged_attention = kernel
    nanoserve.attention.backends.base.packed_prefill_attention = packed
print(counts)

# %% [markdown]
# ## 4. A prompt through the kernel
#
# The kernel can prefill (T query rows with causal horizons), but each query token re-reads its
# prefix from the pool. Packed prefill reads the pool not at all.

# %%
for n in (16, 128, 512, 2048):
    print(f"{n:5d}-token prompt: kernel reads {engine_read.prefix_cells_read(n):>9,} pool cells "
          f"per KV head and layer; packed prefill reads 0")
