# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 49 notebook: the decode forward through torch.compile
#
# The shipped model, in float32 on a CPU, with its decode step compiled by inductor. In about
# a minute (less when inductor's on-disk cache is warm) this notebook:
#
# 1. generates text with `LLM(compile=True)` and prints each compilation with its bucket;
# 2. checks the tokens against the eager engine;
# 3. shows the graph dynamo hands the backend, with the attention read as one opaque call per
#    layer;
# 4. profiles an eager and a compiled decode step, and times them against each other.

# %%
import contextlib
import logging
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch
from torch.profiler import ProfilerActivity, profile

from chapters.common import SHIPPED
from chapters.day49_compiled_decode import claims
from nanoserve import LLM, SamplingParams

torch.set_num_threads(1)
logging.basicConfig(stream=sys.stdout, format="  log: %(message)s")
logging.getLogger("nanoserve").setLevel(logging.INFO)

# %% [markdown]
# ## 1. Compile, and watch it happen
#
# Eight prompts over four slots: the batch shrinks as requests finish, so the run meets
# several buckets. Each compilation is logged once, with its wall time.

# %%
prompts = ["Once upon a time", "The little cat sat on the", "Hi", "Why", "The for statement",
           "In a small village there lived", "Classes provide", "The sun"]
params = [SamplingParams(temperature=0, max_tokens=(4, 8, 16, 32)[i % 4], ignore_eos=True)
          for i in range(len(prompts))]
# The engine as it stood on this day: weights as loaded (every projection a plain aten::mm),
# no C++ ops, and Day 28's rectangle as the decode read.
kw = dict(dtype="float32", max_num_seqs=4, max_model_len=64, prepack=False, kernels=False,
          attention="reference")
t0 = time.perf_counter()
compiled = LLM(SHIPPED, compile=True, **kw)
outs = compiled.generate(prompts, params)
c = compiled.engine.compiled
print(f"buckets {c.buckets}; {c.compiles} compilations; warm-up {c.warmup_s:.1f} s of a "
      f"{time.perf_counter() - t0:.1f} s run; {c.calls} compiled decode calls, "
      f"{c.padded_rows} pad rows computed")
again = compiled.generate(prompts, params)
print(f"the same requests again: {c.compiles} compilations in total (none added)")

# %% [markdown]
# ## 2. The same tokens as eager

# %%
eager = LLM(SHIPPED, **kw)
want = eager.generate(prompts, params)
for o, w in zip(outs, want, strict=True):
    print(f"{'same' if o.token_ids == w.token_ids else 'DIFFERENT':9s} {o.text!r}")

# %% [markdown]
# ## 3. Where an eager step spends its time, and what compiling changes
#
# Four rows decoding, profiled for sixteen steps each way. `aten::mm` is the same kernel either
# way: inductor hands matmuls back to aten.

# %%
def decode_steps(llm, steps, tag, around=None):
    """Prefill 4 requests, then time ``steps`` decode-only steps (inside ``around``)."""
    p = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for i in range(4):
        llm.core.add(llm.core.make_request(f"{tag}{i}", [0, 5 + i, 9, 11], p))
    with torch.inference_mode():
        llm.core.step()  # the prefill
        with around or contextlib.nullcontext():
            t0 = time.perf_counter()
            for _ in range(steps):
                llm.core.step()
            dt = time.perf_counter() - t0
        while llm.core.has_unfinished():
            llm.core.step()
    return dt


for name, llm in (("eager", eager), ("compiled", compiled)):
    prof = profile(activities=[ProfilerActivity.CPU])
    decode_steps(llm, 16, f"p{name}", around=prof)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows)
    print(f"{name}: top operators by self time")
    for e in rows[:5]:
        print(f"  {e.key[:40]:40s} {e.self_cpu_time_total / total:6.1%}  "
              f"{e.count / 16:g} calls a step")

# %% [markdown]
# A small interleaved timing at batch 4: the comparison the README's speed row bounds (there at
# batch 8).

# %%
best = {"eager": float("inf"), "compiled": float("inf")}
for r in range(3):
    for name, llm in (("eager", eager), ("compiled", compiled)):
        best[name] = min(best[name], decode_steps(llm, 32, f"t{r}{name}"))
ratio = best["eager"] / best["compiled"]
print(f"32 decode steps at batch 4: eager {best['eager'] * 1e3:.0f} ms, compiled "
      f"{best['compiled'] * 1e3:.0f} ms; compiled / eager speed {ratio:.2f}x")

# %% [markdown]
# ## 4. What dynamo traced
#
# The frozen `CompiledDecode` with a backend that only keeps the graph it is given. The read
# is `day49::paged_attend` in the snapshot: one call per layer, with nothing of the cache in
# the graph. (This resets dynamo, so it comes last: the LLM above would recompile.)

# %%
graphs, ops = claims.opaque()
gm = claims.GRAPHS[-1]
print(f"{graphs} graph over 12 decode steps; paged_attend calls in it: {ops}")
targets = [str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes
           if n.op == "call_function"]
print(f"{len(targets)} calls in the graph; the first layer's, in order:")
first = targets[:targets.index(next(t for t in targets if "paged_attend" in t)) + 12]
print("  " + ", ".join(first))
