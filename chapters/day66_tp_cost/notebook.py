# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 66 notebook: what crosses between the ranks
#
# A tensor-parallel decode step meets the other ranks at 2L + 1 all-reduces of (rows, hidden),
# one gather of the float32 logits and one broadcast of the fixed header. This notebook first
# prices those from the shapes alone with the frozen cost model, then counts them on a real
# `-tp 2` engine and checks that the two agree. In about a minute on a CPU:
#
# 1. the cost model for three shapes and several row counts;
# 2. what grows with rows and what does not (context length, the header);
# 3. nanoserve-tiny at `tensor_parallel_size=2`: `step_split` on rank 0, and its counted bytes
#    against the model, collective by collective.
#
# Part 3 spawns a worker process, and a spawned process imports this file again (as
# `__mp_main__`) before running the worker. The engine therefore lives in `main()`, and every
# cell that prints sits under `if __name__ == "__main__":`, so the worker's import stays quiet.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import json

from chapters.common import SHIPPED
from chapters.day66_tp_cost.snapshot.cost import step_bytes
from nanoserve.bench.shapes import shape_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
TINY = json.loads((SHIPPED / "config.json").read_text())
SHAPES = {"nanoserve-tiny": TINY, "SmolLM2-135M": shape_config("smollm2-135m"),
          "Llama-3.2-1B": shape_config("llama-3.2-1b")}


def model_bytes(cfg: dict, rows: int, dtype: str = "float32", tp: int = 2) -> dict:
    return step_bytes(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], rows, tp,
                      DTYPE_BYTES[dtype])


# %% [markdown]
# ## 1. The cost model
#
# `step_bytes` needs three numbers from `config.json` (layers, hidden size, vocabulary) and
# two from the engine (rows, ranks), plus the activation dtype. The table gives bytes per decode
# step at `-tp 2`. All-reduce is the total of the 2L + 1 calls; gather is rank 0's (rows,
# ceil(V/2)) float32 shard, the input tensor that `CommStats` counts.

# %%
if __name__ == "__main__":
    print(f"{'shape':>15} {'dtype':>9} {'rows':>5} {'all-reduces':>11} {'all-reduce B':>13} "
          f"{'a layer B':>10} {'gather B':>11} {'header B':>9}")
    for name, cfg in SHAPES.items():
        for dtype in ("float32", "bfloat16"):
            for rows in (1, 8, 64):
                b = model_bytes(cfg, rows, dtype)
                print(f"{name:>15} {dtype:>9} {rows:>5} {b['all_reduces']:>11} "
                      f"{b['all_reduce']:>13,} {b['all_reduce_per_layer']:>10,} "
                      f"{b['gather']:>11,} {b['broadcast']:>9,}")

# %% [markdown]
# Two things show in the table. The gather does not care about the dtype: the logits travel
# as float32 either way, so in bfloat16 with a wide vocabulary it can outweigh every all-reduce
# of the step. And at one row nothing is large: even Llama-3.2-1B's shape moves under a megabyte
# per step, so at decode sizes a collective costs mostly its latency, not its bandwidth.

# %% [markdown]
# ## 2. Rows, yes; context, no
#
# Each row of a decode step contributes one new token, and attention over the cached context
# happens inside each rank on its own heads, so the model has no context-length argument for
# decode. Its `tokens` argument is for prefill, where the all-reduced activations are (prompt
# tokens, hidden). Bytes per row stay constant as rows grow, and the header is fixed.

# %%
if __name__ == "__main__":
    cfg = SHAPES["SmolLM2-135M"]
    L, E, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    for rows in (1, 2, 8, 32, 128):
        b = model_bytes(cfg, rows)
        print(f"rows {rows:>3}: all-reduce {b['all_reduce'] // rows:,} B a row, "
              f"gather {b['gather'] // rows:,} B a row, header {b['broadcast']:,} B a step")
    prefill = step_bytes(L, E, V, rows=1, tp=2, act_bytes=4, tokens=192)
    print(f"a 192-token prompt's prefill, float32: all-reduce {prefill['all_reduce']:,} B, "
          f"gather {prefill['gather']:,} B (the last position's logits only)")


# %% [markdown]
# ## 3. Counted on a real engine
#
# The shipped nanoserve-tiny (4 layers, hidden 256, vocabulary 2048) in float32, split over two
# ranks, each pinned to its own core. `step_split(llm, 8, 16)` prefills 8 rows, resets rank 0's
# `CommStats`, runs 16 decode steps and divides by 16. Its time split says how much of rank 0's
# step sat inside collectives. That includes waiting for the worker to arrive, so treat it as an
# upper bound on the communication. Printed values vary from run to run; the bytes do not.

# %%
def main() -> None:
    from nanoserve import LLM
    from nanoserve.bench.tpbench import step_split

    rows, steps = 8, 16
    with LLM(dtype="float32", tensor_parallel_size=2) as llm:
        s = step_split(llm, rows, steps)
    print(f"decode step at {rows} rows: {s['step_ms']:.2f} ms, of which {s['comm_ms']:.2f} ms "
          f"inside collectives ({s['comm_share']:.0%})")
    print("calls per step:", s["calls_per_step"])
    model = model_bytes(TINY, rows)
    print(f"{'collective':>10} {'counted B':>10} {'model B':>10}")
    for kind in ("all_reduce", "gather", "broadcast"):
        counted = s["bytes_per_step"][kind]
        print(f"{kind:>10} {counted:>10,} {model[kind]:>10,}  "
              f"{'same' if counted == model[kind] else 'DIFFERENT'}")
    print(f"all-reduce a layer: counted {s['all_reduce_bytes_per_layer']:,} B, model "
          f"{model['all_reduce_per_layer']:,} B; all-reduces a step: counted "
          f"{s['calls_per_step']['all_reduce']}, model {model['all_reduces']}")


# %%
if __name__ == "__main__":
    main()
