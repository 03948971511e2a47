# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 59 notebook: graphbench, rehearsed on a CPU
#
# On a lent card, `make gpu-check` runs the gpu tests, Day 57's capture and a kernel timing,
# then graphbench's three arms over random Llama-3.2-1B-shaped weights. Here, in about half a
# minute and with no card:
#
# 1. the plan gpu-check would run, the files each stage writes, and what it does without CUDA;
# 2. a reduced run of two of the arms on nanoserve-tiny, one server per arm on 127.0.0.1,
#    each stopped after its arm;
# 3. the ITL p50 and p99 recomputed by the frozen split from what the client saw;
# 4. the `compact_rows=False` control at one rate of the card's workload, with the engine's
#    own counters.
#
# The windows here replay eagerly, so the times are not a graph measurement.

# %%
import contextlib
import io
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check

import nanoserve.bench.serve as bs
from chapters.common import SHIPPED
from chapters.day59_graphbench.snapshot.itl import itl_split
from nanoserve.bench import graphbench

# %% [markdown]
# ## 1. The plan
#
# Each stage writes its results file as soon as it ends. Without CUDA the script says what it
# would do and exits 1, so no GPU claim can pass here.

# %%
print(gpu_check.show_plan(gpu_check.stages()))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = gpu_check.main([])
print("exit", rc, "|", out.getvalue().splitlines()[0])

# %% [markdown]
# ## 2. Two arms on this CPU
#
# The card's graphs and no-compile arms, same flags, on the shipped model: 16 requests of 4
# prompt ids and 16 output tokens, all sent at once, 8 slots. `calculate_metrics` is wrapped
# so the per-request records stay available for section 3.

# %%
records, original = [], bs.calculate_metrics


def recording(outputs, duration_s):
    records.append([o for o in outputs if o.success])
    return original(outputs, duration_s)


bs.calculate_metrics = recording
try:
    report = graphbench.run_arms(str(SHIPPED), "cpu", [float("inf")],
                                 arms=("graphs", "no-compile"), requests=16, input_len=4,
                                 output_len=16, max_num_seqs=8, max_model_len=64,
                                 dtype="float32")
finally:
    bs.calculate_metrics = original
print(graphbench.render_arms(report))

# %% [markdown]
# ## 3. The middle and the tail, recomputed
#
# The frozen split pools every gap of every request and takes p50 and p99 with Day 40's
# percentile; it should agree with the benchmark's own numbers.

# %%
for row, recs in zip(report["rows"], records, strict=True):
    p50, p99 = itl_split([o.itl for o in recs])
    print(f"{row['arm']:10s} frozen p50 {p50:7.3f} ms, p99 {p99:7.3f} ms | benchmark "
          f"{row['itl_p50_ms']:7.3f}, {row['itl_p99_ms']:7.3f} | "
          f"{sum(len(o.itl) for o in recs)} gaps")

# %% [markdown]
# ## 4. The control: `compact_rows=False`
#
# The windows with the persistent batch off, at the card's top rate and request shape. This
# server runs on a thread of this process, so after the load the scheduler's compactor is read
# directly: the compactions and row moves columns are the engine's own counts. The replay gate
# has to fail here; if it passed, it would not be measuring the flag.

# %%
control = graphbench.run_arms(str(SHIPPED), "cpu", [gpu_check.RATES[-1]], arms=("free-rows",),
                              dtype="float32", in_process=True, **gpu_check.WORKLOAD)
print(graphbench.render_arms(control))
