# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 34 notebook: putting preemption into batchbench
#
# On a CPU with the shipped nanoserve-tiny model, in well under a minute:
#
# 1. the chapter's workload through `batchbench.run`, cramped (24 blocks) and roomy;
# 2. what the report says about preemption: counts per request, the recompute share, and the
#    latency of the preempted against the rest;
# 3. two denominators for the recompute bill;
# 4. a second look at latency: the same request, cramped against roomy;
# 5. the frozen Day 34 report on plain records;
# 6. recompute against swap, as arithmetic on the Llama-3.2-1B shape.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import LLAMA_3_2_1B, SHIPPED
from chapters.day34_preemption_measured.snapshot.report import Record, report
from nanoserve import LLM
from nanoserve.bench.batchbench import run, workload

torch.set_num_threads(2)

# %% [markdown]
# ## 1. One workload, two pools
#
# Twelve requests from batchbench's seeded generator (seed 0): prompts of 4 to 24 random token
# ids, 8 to 40 tokens each, greedy with EOS ignored so that every request produces exactly its
# budget. block_size 4 and 8 slots. The cramped engine has 24 blocks (96 token positions); the
# roomy one gets the default pool, far more than this workload can touch. A short warm-up runs
# first on each engine, outside the measurement.

# %%
kw = dict(dtype="float32", block_size=4, max_num_seqs=8)
cramped, roomy = LLM(SHIPPED, num_kv_blocks=24, **kw), LLM(SHIPPED, **kw)
prompts, gens = workload(12, 0, (4, 24), (8, 40), cramped.config.vocab_size)
print("prompt lengths:", [len(p) for p in prompts])
print("max_tokens:    ", gens)
for llm in (cramped, roomy):
    run(llm, prompts[:2], gens[:2])  # warm-up
before = cramped.stats.iterations, roomy.stats.iterations
c = run(cramped, prompts, gens)
r = run(roomy, prompts, gens)
print("iterations: cramped", cramped.stats.iterations - before[0], "| roomy",
      roomy.stats.iterations - before[1])

# %% [markdown]
# ## 2. What the report says

# %%
for name, res in (("cramped", c), ("roomy", r)):
    print(f"{name:8s} {res['wall_s']:.3f} s, {res['tokens_per_s']:7.1f} tok/s, "
          f"{res['preemptions']:2d} preemptions, recompute share {res['recompute_share']:.1%}, "
          f"{res['tokens_computed']} positions computed")
print("preemptions per request (cramped):", c["preemptions_per_request"])
print(f"requests preempted at least once: {c['preempted_requests']} of {c['requests']}")
print(f"mean latency: preempted {c['latency_preempted_s']:.3f} s, straight through "
      f"{c['latency_straight_s']:.3f} s, ratio "
      f"{c['latency_preempted_s'] / c['latency_straight_s']:.2f}x")
print(f"wall clock, cramped / roomy: {c['wall_s'] / r['wall_s']:.2f}x")
same = sum(a == b for a, b in zip(c["token_ids"], r["token_ids"], strict=True))
print(f"identical tokens: {same} of 12")

# %% [markdown]
# Tokens per second alone would show the cramped run as slower and nothing more. The other
# lines say why: a third of the positions the model computed were positions it had computed
# before.
#
# ## 3. Two denominators
#
# `recomputed_tokens` counts every position a resume prefills, prompt and generated tokens
# alike. One of those positions per resume is the request's newest token, which a decode step
# would have computed anyway. So the cramped run's *extra* work over the roomy run is the
# recompute count minus one per preemption.

# %%
extra = c["tokens_computed"] - r["tokens_computed"]
print(f"recomputed {c['recomputed_tokens']}, preemptions {c['preemptions']}, "
      f"difference {c['recomputed_tokens'] - c['preemptions']}")
print(f"cramped computed {c['tokens_computed']}, roomy {r['tokens_computed']}: "
      f"{extra} more ({extra / c['tokens_computed']:.1%} of the cramped run, "
      f"{extra / r['tokens_computed']:.1%} on top of the roomy run)")

# %% [markdown]
# ## 4. Latency, the same request in both runs
#
# The report compares, within the cramped run, requests that were preempted with requests that
# were not. Victims are the youngest running requests, so they also tend to be the ones that
# arrived later, and part of their wait would have happened anyway. Comparing each request
# with itself in the roomy run separates the two.

# %%
print(" req  preempted  cramped s  roomy s  ratio")
for i, (n, lc, lr) in enumerate(zip(c["preemptions_per_request"], c["latencies_s"],
                                    r["latencies_s"], strict=True)):
    print(f"r{i:<3d} {n:9d} {lc:10.3f} {lr:8.3f} {lc / lr:6.2f}")

# %% [markdown]
# ## 5. The frozen report
#
# The claims compute their numbers with `snapshot/report.py`, which takes one plain record per
# request (preemptions, arrival and hand-back times) and the engine-wide counters, and imports
# nothing but the standard library.

# %%
records = [Record(n, 0.0, t) for n, t in zip(c["preemptions_per_request"], c["latencies_s"],
                                             strict=True)]
rep = report(records, c["recomputed_tokens"], c["tokens_computed"])
print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rep.items()})

# %% [markdown]
# ## 6. Recompute or swap
#
# Recompute pays in arithmetic: a resumed request runs a prefill over its whole history. Swap
# pays in transfers: the victim's K/V blocks go to host memory and come back over the host
# link. On this CPU there is no second tier to swap to, so only recompute exists here. On a GPU
# the trade can be estimated from the shape: bytes of K/V per token against FLOPs per token.

# %%
cfg = LLAMA_3_2_1B
kv_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
params = 1.236e9  # Llama-3.2-1B, tied embeddings
print(f"Llama-3.2-1B, bf16: {kv_bytes:,} bytes of K/V per token "
      f"({2 * kv_bytes:,} to swap it out and back)")
print(f"recompute: about {2 * params / 1e9:.1f} GFLOP per token (2 x parameters, before "
      f"attention)")
for n in (100, 1000):
    print(f"a {n:4d}-token victim: swap moves {2 * kv_bytes * n / 2**20:6.1f} MiB; "
          f"recompute does {2 * params * n / 1e12:5.2f} TFLOP")

# %% [markdown]
# Which is cheaper depends on the card's FLOP/s against its host-link bandwidth, on how well a
# recompute prefill batches with other work, and on whether host memory is free to hold
# swapped blocks. That is a measurement for a machine with a GPU. The counters above are what
# such a measurement will need to report.
