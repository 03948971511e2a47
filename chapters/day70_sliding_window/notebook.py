# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 70 notebook: a sliding window in a paged cache
#
# A layer with a window of `w` tokens lets the query at position `i` see the key at `j` only
# when `i - w < j <= i`. When every layer has one, the blocks behind the window are never read
# again and can go back to the pool while the request runs. In well under a minute on a CPU:
#
# 1. the rule, from the frozen snapshot, against a brute-force reading of the mask;
# 2. one request's block table as it runs: its first entries turn into the null block;
# 3. the bench's two runs, blocks given back and every block kept, on one backend;
# 4. the null block read under the mask: finite junk and NaN;
# 5. what the families' configs let the pool give back, and what blocks per layer group would
#    keep for a model with global layers.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)  # a 2-layer model of hidden size 64: a second thread only waits

from chapters.day70_sliding_window import claims  # noqa: E402
from chapters.day70_sliding_window.snapshot import window_blocks as frozen  # noqa: E402

W, BS = claims.WINDOW, claims.BLOCK

# %% [markdown]
# ## 1. Which blocks a query reads, and which no later query will
#
# The brute force builds the mask row of a query at `i` and lists the blocks of the keys it
# lets through. A block is dead once the *next* query's window has passed it: every later
# query's window starts further on.

# %%
def brute_visible(i: int) -> list[int]:
    j = torch.arange(i + 1)
    seen = j[(j > i - W) & (j <= i)]
    return sorted({int(p) // BS for p in seen})


for i in (40, 63, 64, 79, 100, 200):
    gone = frozen.out_of_window(i, W, BS)
    print(f"query at {i:3}: reads blocks {list(frozen.visible_blocks(i, W, BS))} "
          f"(brute force {brute_visible(i)}); blocks before {gone.stop} are dead")
print("most blocks one query reads:", max(len(brute_visible(i)) for i in range(512)),
      "= most_visible:", frozen.most_visible(W, BS))

# %% [markdown]
# ## 2. One request's table as it runs
#
# The bench's random 2-layer Mistral (window 64 on both layers), a 32-token prompt and 160
# greedy tokens in blocks of 16. Every 24 steps: where the next query stands, the request's
# block list (block 0 is the null block) and how many blocks the pool has lent out.

# %%
from nanoserve.config import EngineConfig  # noqa: E402
from nanoserve.loader import load_core  # noqa: E402
from nanoserve.sampling.params import SamplingParams  # noqa: E402

core = load_core(EngineConfig(model=claims.checkpoint(), dtype="float32",
                              skip_tokenizer_init=True, kernels=False, block_size=BS,
                              max_num_seqs=2, max_model_len=claims.PROMPT_LEN + 160))
core.add_request("r", claims.prompt(), SamplingParams(temperature=0, max_tokens=160,
                                                       ignore_eos=True))
kv = core.scheduler.kv_cache_manager
print(f"pool: {kv.pool.num_blocks} blocks, {kv.num_blocks} usable; window {kv.window}")
step = 0
with torch.inference_mode():
    while core.has_unfinished():
        core.step()
        step += 1
        if step % 24 == 0 and core.scheduler.running:
            r = core.scheduler.running[0]
            print(f"step {step:3}: next query at {r.num_computed_tokens:3}, blocks {r.blocks}, "
                  f"held {kv.num_held}")
core.release_finished()
core.check_drained()
print("given back while it ran:", kv.window_freed, "; after the drain, free:", kv.num_free)

# %% [markdown]
# ## 3. The bench: blocks given back against every block kept
#
# `nanoserve.bench.window_pool.measure` at its defaults (480 new tokens) on the reference
# backend; the chapter's claims run the gathered backend too.

# %%
b = claims.bench("reference")
print(f"peak blocks held: {b['peak_blocks_freeing']} given back, {b['peak_blocks_keeping']} "
      f"kept; {b['blocks_given_back']} given back in all; identical text: "
      f"{b['identical_text']}; usable blocks {b['usable_blocks']}")
t = claims.trace("reference", True)
print("blocks held, first 40 steps:", t["held"][:40])

# %% [markdown]
# ## 4. The null block under the mask
#
# The entries behind the window name block 0. The reference read gathers its cells for every
# position behind the window and gives them weight 0, so any finite value there is harmless;
# NaN is not, since 0 times NaN is NaN.

# %%
print(claims.null_block_after())
print(claims.poison())
print("0 * 1e4 =", 0 * torch.tensor(1e4).item(), "; 0 * nan =", 0 * float("nan"))

# %% [markdown]
# ## 5. What each family's config lets the pool give back
#
# `served_windows` per family, then the share of KV that blocks per layer group would keep for the
# Gemma-3-270M shape at a few context lengths (only the whole-pool rule is built here).

# %%
print("Phi-3 (2,047 at 4,096 / 262,144 at 131,072):", claims.phi3_windows())
print("Qwen2 (max_window_layers 21 of 28):", claims.qwen2_windows())
print("Gemma-3-270M:", claims.gemma_served())
windows = claims.gemma_windows()
for ctx in (2048, 8192, 32768):
    one, grouped = claims.per_group_blocks(windows, ctx, BS)
    print(f"  {ctx:6,} tokens: one pool {one:6,} blocks, per group {grouped:5,} "
          f"({grouped / one:.1%})")
