# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 56 notebook: four switches, one rule
#
# The speed options of `nanoserve serve` are separate flags, and only
# `EngineConfig.persistent_batch` lets one of them imply another. This notebook, in about
# fifteen seconds on a CPU:
#
# 1. parses command lines with the server's own parser and prints what each resolves to;
# 2. builds the configuration a bundled library could not: windows over free rows;
# 3. runs a handful of the flag combinations on the shipped model and compares their tokens
#    and counters.
#
# No server is started; nothing here needs a GPU.

# %%
import argparse
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day56_flags.snapshot.flags import resolve
from nanoserve import LLM, SamplingParams
from nanoserve.config import EngineConfig
from nanoserve.entrypoints.openai.serve import add_arguments, build_engine

torch.set_num_threads(1)
parser = argparse.ArgumentParser(prog="nanoserve serve")
add_arguments(parser)

# %% [markdown]
# ## 1. Command lines, resolved
#
# `--persistent-batch` and `--no-persistent-batch` write one attribute, `compact_rows`, whose
# default is `None`. `EngineConfig.persistent_batch` is the only code that turns `None` into a
# boolean.

# %%
for argv in ([], ["--cuda-graphs"], ["--cuda-graphs", "--no-persistent-batch"],
             ["--persistent-batch"], ["--no-persistent-batch"],
             ["--compile", "--attention", "reference"]):
    args = parser.parse_args(argv)
    cfg = EngineConfig.from_cli_args(args)
    print(f"{' '.join(argv) or '(no flags)':42s} compact_rows={args.compact_rows!s:5s} -> "
          f"compile={cfg.compile}, attention={cfg.attention}, cuda_graphs={cfg.cuda_graphs}, "
          f"persistent_batch={cfg.persistent_batch}")

# %% [markdown]
# The frozen rule says the same in one line: follow the graphs unless told.

# %%
for pb in (None, True, False):
    print(f"persistent_batch={pb!s:5s}  graphs off -> {resolve(False, pb)!s:5s}  "
          f"graphs on -> {resolve(True, pb)}")

# %% [markdown]
# ## 2. The control run a bundled library could not build
#
# Below the command line nothing implies anything: asking `build_engine` (with a config) for
# windows over free rows gets exactly that. This is the arm that shows the persistent batch,
# not the windows, to be what lifts the replay share.

# %%
engine = build_engine(EngineConfig(SHIPPED, cuda_graphs=True, compact_rows=False,
                                   dtype="float32", max_model_len=64, skip_tokenizer_init=True))
print("windows:", engine.core.engine.graphs)
print("compactor:", engine.core.scheduler.compactor)

# %% [markdown]
# ## 3. A few combinations, side by side
#
# Eight greedy requests (lengths 4/8/16/32) over four slots. The tokens must not move; the
# counters should.

# %%
prompts = [[0, 5 + i, 9, 11] for i in range(8)]
params = [SamplingParams(temperature=0, max_tokens=(4, 8, 16, 32)[i % 4], ignore_eos=True)
          for i in range(8)]
plain = None
for attention, graphs, compact in [("reference", False, False), ("gathered", False, False),
                                   ("gathered", True, False), ("gathered", True, True),
                                   ("gathered", False, True), ("gathered", True, None)]:
    run = LLM(SHIPPED, dtype="float32", max_num_seqs=4, max_model_len=64,
              skip_tokenizer_init=True, attention=attention, cuda_graphs=graphs,
              compact_rows=compact)
    toks = [o.token_ids for o in run.generate(prompts, params)]
    plain = plain or toks
    s = run.stats
    print(f"attention={attention:9s} cuda_graphs={graphs!s:5s} compact_rows={compact!s:5s}"
          f" (resolved {run.compact_rows!s:5s}): same tokens {toks == plain}, "
          f"decode steps {s.decode_steps}, replayed {s.decode_steps_replayed} "
          f"({s.replay_share:.0%})")

# %% [markdown]
# The claims run all sixteen combinations, with compile through dynamo as a fourth switch;
# `make chapter-56` prints them.
