# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 54 notebook: the decode step's small ops, fused
#
# In well under a minute on a CPU, once the C++ ops are built (`python -m nanoserve.cpu.csrc`;
# without them every cell below says why and skips), this notebook:
#
# 1. loads the ops and says where they came from;
# 2. holds each op against its PyTorch reference, in bf16 and float32;
# 3. shows what one plain bf16 RMSNorm dispatches and allocates;
# 4. profiles one decode step of the shipped nanoserve-tiny with the ops off and on, and
#    prints what the profiler sees;
# 5. generates text with the ops off and on;
# 6. prints this machine's small-M matmul choices and times one shape.

# %%
import json
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day54_fused_cpu_ops import claims
from nanoserve import LLM, SamplingParams
from nanoserve.cpu import csrc

torch.set_num_threads(1)

# %% [markdown]
# ## 1. The library
#
# `load()` builds the ops the first time a machine asks for them (the cell prints how long that
# took) and afterwards finds the library by a key over its sources, flags, torch version and
# CPU. It returns `None` when `torch.ops.nanoserve` is ready, or the reason it is not.

# %%
t0 = time.perf_counter()
why = csrc.load()
print("reason not loaded:", why)
print(f"load() took {time.perf_counter() - t0:.2f} s; built in this process: "
      f"{csrc.build_seconds():.1f} s (0.0: it came from the cache)")
print("library:", csrc.build_dir() / f"nanoserve_ops_{csrc.build_key()}")
print("CPU:", csrc.cpu_model())
HAVE_OPS = why is None
if HAVE_OPS:
    print("small-M kernel (AVX512-BF16, or AVX2 with FMA) compiled in:",
          torch.ops.nanoserve.small_gemm_available())

# %% [markdown]
# ## 2. Each op against its reference
#
# 200 seeded batches of 8 rows at SmolLM2-135M's sizes. For each op the table gives the
# largest absolute difference, the same in bf16 rounding steps, and how many elements differ at
# all. The elementwise ops round where the reference rounds, so they match it exactly. The norms
# take a sum in another order, so now and then a bf16 output lands one step away.

# %%
if HAVE_OPS:
    for dtype in ("bfloat16", "float32"):
        print(dtype)
        for name, (worst, steps, differ, total) in claims.op_differences(dtype).items():
            in_steps = f"({steps:4.2f} bf16 steps)  " if dtype == "bfloat16" else ""
            print(f"  {name:20s} max |diff| {worst:9.2e}  {in_steps}"
                  f"{differ:7,} of {total:9,} elements differ")
else:
    print("skipped:", why)

# %% [markdown]
# ## 3. One plain RMSNorm, op by op
#
# Day 1's module, bf16, 8 decode rows of 576, under a `TorchDispatchMode` that records every
# aten op and the bytes of the tensors it made (a view or a no-op cast makes none).

# %%
for i, (name, made, dtypes) in enumerate(claims.plain_norm(torch.bfloat16), 1):
    print(f"  {i}. aten.{name:6s} {made:7,} bytes  {', '.join(map(str, dtypes))}")
print("float32 for comparison: the casts are no-ops and make nothing:")
for i, (name, made, _) in enumerate(claims.plain_norm(torch.float32), 1):
    print(f"  {i}. aten.{name:6s} {made:7,} bytes")

# %% [markdown]
# ## 4. One decode step under the profiler
#
# nanoserve-tiny in float32, 8 requests decoding, the gathered read in both arms, so that
# the difference is today's ops alone. The counts are calls inside the model's forward and its
# LM head, nested calls included. Counting is exact, and the same from one step to the next.

# %%
def tiny_llm(kernels: bool):
    llm = LLM(dtype="float32", kernels=kernels, attention="gathered", skip_tokenizer_init=True,
              max_num_seqs=8)
    g = torch.Generator().manual_seed(54)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for i in range(8):
        prompt = torch.randint(2, 2000, (16 + 8 * i,), generator=g).tolist()
        llm.core.add(llm.core.make_request(f"r{i}", prompt, params))
    with torch.inference_mode():
        llm.core.step()  # prefill
        llm.core.step()  # one warm decode step
    return llm


if HAVE_OPS:
    for kernels in (False, True):
        llm = tiny_llm(kernels)
        steps = [claims.profile_step(llm) for _ in range(3)]
        p = steps[-1]
        print(f"kernels={kernels!s:5s}: {p['ops']:,} ops ({[s['ops'] for s in steps]} over "
              f"three steps), {p['copies']} aten::copy_; self CPU: linear layers "
              f"{p['linear_us'] / 1e3:.2f} ms, everything else {p['other_us'] / 1e3:.2f} ms")
else:
    print("skipped:", why)

# %% [markdown]
# Which ops those are: the most called, kernels off and on. The norms' `pow`, `mean`, `rsqrt`
# and casts, and RoPE's `cat`, `neg` and `chunk`, are gone. In their place is one `nanoserve::`
# call per norm, per RoPE with its cache write and per activation, and `nanoserve::small_gemm`
# for the matmul shapes this machine gave the small-M kernel. What is left is mostly views and
# the gathered read's own ops.

# %%
if HAVE_OPS:
    for kernels in (False, True):
        names = claims.profile_step(tiny_llm(kernels))["names"]
        print(f"kernels={kernels}:")
        print("  ", ", ".join(f"{n} x{c}" for n, c in names.most_common(10)))
        print("   nanoserve ops:", {n: c for n, c in names.items() if n.startswith("nanoserve")})


# %% [markdown]
# ## 5. Text, with and without the ops
#
# The shipped model with its tokenizer, greedy, float32: the ops change where the work is
# done, not what is computed, so the text is the same.

# %%
if HAVE_OPS:
    prompts = ["Once upon a time", "The little robot"]
    params = SamplingParams(temperature=0, max_tokens=24)
    texts = {}
    for kernels in (False, True):
        llm = LLM(dtype="float32", kernels=kernels, attention="reference")
        texts[kernels] = [o.text for o in llm.generate(prompts, params)]
        print(f"kernels={kernels}: llm.kernels is {llm.kernels} ({llm.kernels_reason})")
    for p, off, on in zip(prompts, texts[False], texts[True], strict=True):
        print(f"{p!r}\n  off: {off!r}\n  on:  {on!r}\n  same: {off == on}")

# %% [markdown]
# ## 6. The small-M matmul on this machine
#
# `build/small_gemm.json` holds each weight shape's verdict, measured once per CPU, torch
# version, thread count, dtype, the linear it was timed against (oneDNN's packed one, or
# `F.linear` where oneDNN does not pack) and build of the kernels: that linear's time over the
# small kernel's at 1, 2, 4 and 8 rows (and 64 and 512 after a win at 8), and the largest batch
# the small kernel takes (0: never). Then one shape against oneDNN, timed now, where oneDNN has
# a bf16 kernel.

# %%
from nanoserve.cpu.small_gemm import ALL_ROWS, cache_path

table = json.loads(cache_path().read_text()) if cache_path().is_file() else {}
mine = {k: v for k, v in table.items()
        if k.startswith(f"{csrc.cpu_signature()}|torch {torch.__version__}|")
        and k.endswith(f"|ops {csrc.build_key()}")}
for key, row in sorted(mine.items()):
    # cpu|torch|threads|shape|margin|dtype|vs <linear>|prefill <rows>|ops
    _, _, threads, shape, _, dtype, against, *_ = key.split("|")
    (over,) = (v for k, v in row.items() if k.endswith("_over_small"))
    ratios = "  ".join(f"{m} row(s) {r:5.2f}" for m, r in over.items())
    takes = ("every batch" if row["rows"] >= ALL_ROWS else
             f"up to {row['rows']} rows" if row["rows"] else "never")
    print(f"{shape:>10s} {dtype:>8s}, {threads}, {against}: {ratios}  -> small kernel {takes}")
if not mine:
    print("no choices measured on this machine yet (an LLM with kernels on measures them)")

why_small = claims.bf16_onednn_missing()
if why_small is None:
    for rows in (1, 2, 4, 8):
        print(f"o_proj 576 -> 576, {rows} row(s): oneDNN / small = "
              f"{claims.onednn_over_small('o', rows, rounds=3):.2f}x")
else:
    print("skipped:", why_small)
