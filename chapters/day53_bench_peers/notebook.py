# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 53 notebook: one workload, every engine, one run
#
# The harness behind `nanoserve bench offline`, small enough to run here in well under a
# minute on a CPU:
#
# 1. the seeded ragged workload, and what static waves of it would decode;
# 2. nanoserve, transformers' `generate` and transformers' continuous batching on the shipped
#    nanoserve-tiny in float32, one torch thread each, one round, with the token check that makes
#    the comparison fair;
# 3. the recorded full runs (SmolLM2-135M's shape, 16 requests, vLLM's CPU build included), read
#    from `results/`.
#
# Nothing here needs vLLM or a GPU; the vLLM rows come from the committed records.

# %%
import json
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from nanoserve.bench.adapters import Setup
from nanoserve.bench.runner import run_offline
from nanoserve.bench.workload import make_workload, wave_accounting

torch.set_num_threads(1)

# %% [markdown]
# ## 1. The workload
#
# Sixteen requests drawn from `random.Random(0)`: prompt lengths first, then output budgets,
# then the prompt ids. EOS is ignored, so each request produces exactly its budget; that makes
# "useful tokens" the same number for every engine.

# %%
wl = make_workload(16)
print("prompt lengths:", [len(p) for p in wl.prompts])
print("output budgets:", wl.max_tokens)
print("useful tokens: ", wl.useful_tokens)
waves = wave_accounting(wl.max_tokens, 8)
print(f"static waves of 8: {waves['waves']} waves, {waves['computed_tokens']} row-steps, "
      f"{waves['wasted_tokens']} of them waste "
      f"({waves['wasted_tokens'] / waves['computed_tokens']:.0%})")

# %% [markdown]
# ## 2. A reduced run, three engines
#
# `run_offline` loads every engine, warms each up on the first rows with a short budget, then
# times the engines in turn. Each row reports how many requests came out with exactly
# nanoserve's tokens: in float32, greedy, a peer that disagrees means the harness handed the
# engines different work, and its speed would mean nothing.

# %%
small = make_workload(requests=6, prompt_lens=(8, 48), gen_lens=(4, 24))
setup = Setup(model=SHIPPED, dtype="float32", device="cpu", batch=4,
              max_model_len=small.max_len)
report = run_offline(setup, small, engines=("nanoserve", "hf", "hf-cb"), rounds=1)
for row in report["rows"]:
    print(f"{row['engine']:10s} {row['status']:4s} {row['tokens_per_s']:8.1f} tok/s  "
          f"same tokens as nanoserve: {row['same_tokens_as_nanoserve']} of 6  "
          f"threads: {row['threads']}")

# %% [markdown]
# These tokens/s figures come from one round of a few hundred tokens on a shared 2-core
# machine; they are here to show the harness working, not to rank the engines. The ranking
# comes from the recorded runs: three rounds, the engines' order rotating, the median kept.
#
# ## 3. The recorded runs

# %%
for path in sorted((ROOT / "chapters" / "day53_bench_peers" / "results").glob("*.json")):
    record = json.loads(path.read_text())
    rep = record["report"]
    print(f"{path.name}: {rep['model_name']}, {rep['dtype']}, {rep['workload']['requests']} "
          f"requests, {rep['workload']['batch']} rows; {record['machine']}, {record['date']}, "
          f"load average {rep['hardware']['loadavg_1m']}")
    for row in rep["rows"]:
        if row["status"] == "ok":
            print(f"   {row['engine']:10s} {row['tokens_per_s']:7.1f} tok/s  "
                  f"nanoserve/it {row['nanoserve_ratio']:.2f}x  ({row['threads']})")
        else:
            print(f"   {row['engine']:10s} {row['status']}: {row['reason']}")
