# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 57 notebook: windows over static buffers
#
# A CUDA graph replays the same kernels over the same addresses, so a decode step has to be
# made to fit one. On this CPU there is no capture: the same window code runs eagerly over the
# same buffers, which is enough to see everything but the recording. In about ten seconds:
#
# 1. the capture list and the bucket each batch size pads to;
# 2. one three-row step through the four-row window, by hand, with its copy-in table;
# 3. the same table from the frozen snapshot;
# 4. a replaced buffer, and the address check that stops the next replay;
# 5. the worst shape over free rows: how many decode steps replay, and through which windows.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day57_graph_capture.snapshot import windows as frozen
from nanoserve import LLM, SamplingParams
from nanoserve.cuda.graphs import bucket_for, capture_sizes

torch.set_num_threads(1)

# %% [markdown]
# ## 1. The capture list
#
# Powers of two below `max_num_seqs`, then `max_num_seqs`. A step pads up to the next bucket.

# %%
for slots in (4, 6, 8, 12):
    sizes = capture_sizes(slots)
    print(f"max_num_seqs {slots:2d}: {sizes}  pads 1..{slots} rows to",
          [bucket_for(n, sizes) for n in range(1, slots + 1)])

# %% [markdown]
# ## 2. One padded step
#
# Three requests are prefilled into rows 0, 1 and 2 of a four-slot engine; the next decode step
# visits them in the order (2, 0, 1), which is still a prefix, so it replays the bucket-4 window
# with one pad row.

# %%
llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, max_model_len=64, block_size=4,
          skip_tokenizer_init=True, cuda_graphs=True)
e, cache = llm.engine, llm.engine.cache
g = e.graphs
print(g)
prompts = [[0, 5, 9], [0, 7, 8, 9, 10, 11], [0, 3]]
with torch.inference_mode():
    for row, toks in enumerate(prompts):
        e.grant(row, len(toks) + 4)
    e.prefill([0, 1, 2], prompts)
    lengths = {r: cache.lengths[r] for r in range(3)}
    cells = {r: cache.tables[r].cells(lengths[r], lengths[r] + 1)[0] for r in range(3)}
    k_before = cache.k.clone()
    logits = e.decode([2, 0, 1], [4, 6, 12])
print("lengths before:", lengths, " new cells:", cells)
print(g, "by bucket", g.by_bucket)
print("copy-in (ids, positions, write cells, src rows, context):")
for name, row in zip(["ids", "positions", "write", "src", "context"],
                     g.buffers.inputs[:, :4].tolist(), strict=True):
    print(f"  {name:9s} {row}")
changed = (cache.k != k_before).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
print("K cells changed by the step:", changed, "; pad row's slot-table row:",
      cache.slots.cells[3, :8].tolist())

# %% [markdown]
# ## 3. The frozen copy-in
#
# The snapshot builds the same table from the same lengths and cells.

# %%
table = frozen.host_inputs([2, 0, 1], [4, 6, 12], lengths, cells, 4)
print(table)
print("same as the engine's buffers:", table == g.buffers.inputs[:, :4].tolist())

# %% [markdown]
# ## 4. The address check
#
# The windows remember where every buffer lives. Replace one and the next replay refuses.

# %%
print("addresses held:", list(g._current_addresses()))
g.buffers.hidden = g.buffers.hidden.clone()
try:
    with torch.inference_mode():
        e.decode([0, 1, 2], [1, 2, 3])
except AssertionError as err:
    print("AssertionError:", err)

# %% [markdown]
# ## 5. The worst shape over free rows
#
# Eight slots, sixteen requests each wanting one of four lengths. Every row is handed out by the
# free-row heap, so a step replays only while its rows happen to be a prefix.

# %%
gen = (4, 8, 16, 32)
ps = [SamplingParams(temperature=0, max_tokens=gen[i % 4], ignore_eos=True) for i in range(16)]
run = LLM(SHIPPED, dtype="float32", max_num_seqs=8, max_model_len=64, skip_tokenizer_init=True,
          cuda_graphs=True, compact_rows=False, enable_chunked_prefill=False)
run.generate([[0, 5 + i, 9, 11] for i in range(16)], ps)
s, w = run.stats, run.engine.graphs
print(f"{s.decode_steps} decode steps, {s.decode_steps_replayed} replayed, "
      f"{s.decode_steps_scattered} scattered ({s.replay_share:.0%}); padded rows {w.padded_rows}; "
      f"by bucket {w.by_bucket}")
