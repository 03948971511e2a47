# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 52 notebook: what "auto" picks, and what bf16 buys and costs
#
# On a CPU, in about a minute, with the live package:
#
# 1. this processor's flags, the rule, and the log line `LLM(dtype="auto")` writes;
# 2. the frozen rule asked about processors this machine is not;
# 3. one SmolLM2-sized projection timed in float32 and bf16 at several batch sizes;
# 4. the bf16 logit error against transformers, on nanoserve-tiny and on SmolLM2-135M's shape;
# 5. greedy continuations on nanoserve-tiny in bf16 against float32.
#
# On a processor without `amx_bf16` or `avx512_bf16`, section 3 shows what bf16 costs through
# `F.linear` without native instructions.

# %%
import json
import logging
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch
import torch.nn.functional as F

from chapters.common import SHIPPED
from chapters.day52_bf16_cpu.snapshot import dtype as rule
from nanoserve import LLM, SamplingParams
from nanoserve.model.weights import BF16_CPU_FLAGS, cpu_flags, cpu_native_bf16, load_model
from nanoserve.testing import load_hf_model, relative_logit_error
from nanoserve.tokenizer import Tokenizer

torch.set_num_threads(1)
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
logging.getLogger("nanoserve").setLevel(logging.INFO)

# %% [markdown]
# ## 1. This processor
#
# The kernel lists the processor's features in `/proc/cpuinfo`. Two of them make a bf16 matrix
# product native. The package reads them; the frozen rule reads the same text.

# %%
flags = cpu_flags()
print("bf16 flags present:", sorted(set(BF16_CPU_FLAGS) & flags) or "none")
print("cpu_native_bf16():", cpu_native_bf16())
print("torch dispatch level:", torch.backends.cpu.get_cpu_capability())
print("frozen rule says:", rule.resolve_dtype("auto"), "-", rule.reason("auto"))

llm = LLM(SHIPPED, dtype="auto", max_model_len=64)  # writes the INFO line above
print("llm.dtype =", llm.dtype, "| llm.dtype_reason =", llm.dtype_reason)

# %% [markdown]
# The package itself does not stop at the flags: "auto" times the model's MLP in both dtypes at
# the first load and keeps the verdict in `build/dtype_auto.json`, one entry per processor
# model, torch version, thread count and shape. Here is what this machine measured.

# %%
from nanoserve.cpu.auto_dtype import cache_path  # noqa: E402

for key, verdict in json.loads(cache_path().read_text()).items():
    print(key, "->", verdict)

# %% [markdown]
# ## 2. Other processors
#
# The rule takes the flags as an argument, so it can be asked about any machine. An explicit
# dtype always wins.

# %%
machines = {"Sapphire Rapids (AMX)": {"avx512f", "amx_tile", "amx_bf16"},
            "Zen 4 / Cooper Lake (AVX512-BF16)": {"avx512f", "avx512_bf16"},
            "Zen 3 / Skylake-X (AVX512 or AVX2 only)": {"avx2", "avx512f"},
            "a card": set()}
for machine, fl in machines.items():
    device = "cuda" if machine == "a card" else "cpu"
    auto = rule.resolve_dtype("auto", fl, device, checkpoint_dtype="bfloat16")
    asked = rule.resolve_dtype("float32", fl, device)
    print(f"{machine:40s} auto -> {str(auto):15s} float32 asked -> {asked}")

# %% [markdown]
# ## 3. What the instructions buy
#
# One projection in SmolLM2-135M's shape (576 inputs, 3,072 outputs: gate and up fused), for
# M rows at a time. M = 1 is one decode row; a decode step with M requests running puts M rows
# through every projection. Best of five repeats, the two dtypes alternating.

# %%
def best_time(x, w, repeats=5, calls=20):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            F.linear(x, w)
        best = min(best, time.perf_counter() - t)
    return best / calls


w32 = torch.randn(3072, 576)
for m in (1, 8, 64, 512):
    x32 = torch.randn(m, 576)
    fp32 = best_time(x32, w32)
    bf16 = best_time(x32.bfloat16(), w32.bfloat16())
    print(f"M = {m:3d}: float32 {fp32 * 1e3:6.2f} ms, bf16 {bf16 * 1e3:6.2f} ms, "
          f"float32 / bf16 {fp32 / bf16:.2f}x")

# %% [markdown]
# ## 4. What bf16 costs: logits against transformers
#
# nanoserve-tiny on 64 tokens of text, ours and transformers' own Llama on the same folder.
# The fair comparison for our bf16 is transformers' bf16, both measured against transformers'
# float32.

# %%
tok = Tokenizer.from_dir(SHIPPED)
TEXT = ("The with statement wraps a block in the methods of a context manager: __enter__ runs "
        "before the block and its result is bound to the name after as, and __exit__ runs "
        "after it, whether the block finished normally or raised. A list comprehension builds "
        "a new list from an iterable in one expression, with an optional condition that "
        "filters the items it keeps.")
ids = torch.tensor([tok.encode(TEXT, add_special_tokens=False)[:64]])
pos = torch.arange(ids.shape[1])[None]
with torch.no_grad():
    ref = load_hf_model(SHIPPED)
    want = ref(ids).logits[0]
    theirs = ref.to(torch.bfloat16)(ids).logits[0]
    for dtype in ("float32", "bfloat16"):
        ours = load_model(SHIPPED, dtype)
        got = ours.compute_logits(ours(ids, pos))[0]
        agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
        print(f"ours {dtype:8s} vs transformers fp32: {relative_logit_error(got, want):.2e}, "
              f"argmax agrees at {agree:.0%} of positions (logits {got.dtype})")
print(f"transformers bf16 vs transformers fp32: {relative_logit_error(theirs, want):.2e}")

# %% [markdown]
# The same on random weights in SmolLM2-135M's shape, with the bench command's own function
# (`python -m nanoserve.bench.speedpaths bf16`). Transformers writes the checkpoint first,
# which takes a few seconds.

# %%
from nanoserve.bench import speedpaths  # noqa: E402

speedpaths.bf16()

# %% [markdown]
# ## 5. Greedy tokens, bf16 against float32
#
# An error of about 1% of the logits' range is enough to flip an argmax where the top two are
# close, and after the first flip a greedy continuation goes its own way. This is why every
# test that compares tokens asks for `dtype="float32"`.

# %%
prompts = ["def read_config(path):", "A dictionary maps keys to", "Exceptions are raised",
           "The built-in function len", "class Point:", "import os\nimport sys\n",
           "A decorator is a function that", "for i in range("]
params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
runs = {d: LLM(SHIPPED, dtype=d, max_model_len=128).generate(prompts, params)
        for d in ("float32", "bfloat16")}
for p, a, b in zip(prompts, runs["float32"], runs["bfloat16"], strict=True):
    pairs = zip(a.token_ids, b.token_ids, strict=True)
    first = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
    print(f"{p!r:36s} " + ("identical" if first is None else f"diverges at token {first}"))
