# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 42 notebook: what the token budget buys, measured
#
# Day 41 gave every step a token budget (`max_num_batched_tokens`): the running streams' decode
# tokens first, then prompt tokens, the last prompt cut to what is left (chunked prefill). Here
# the budget is measured from outside, over HTTP, on a CPU in about two minutes. As in the
# chapter, every engine runs PyTorch's own operations, with the C++ CPU ops off
# (`--kernels off --attention gathered`):
#
# 1. the workload, `long_among_short`: streams with a long prompt arriving among them;
# 2. how each budget cuts that long prompt, on the live scheduler with no model;
# 3. what a step with a chunk costs against a decode-only step, on the engine in this process;
# 4. one round of `bench serve` against one `nanoserve serve` per setting, with one budget more
#    than the claims use (1024), for the sweep the prose discusses.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import math

from chapters.common import hardware
from chapters.day42_budget_measured import claims
from chapters.day42_budget_measured.arms import measure
from chapters.day42_budget_measured.snapshot.workload import long_among_short

print(hardware())

# %% [markdown]
# ## 1. The workload
#
# 24 requests, seed 0. Every 4th is *long*: 768 random ids, 8 tokens out. The rest are *short*:
# 16 ids, 64 tokens streamed. The order is kept, so at rate 8 a long prompt arrives about every
# half second, while earlier streams are still running.

# %%
reqs = long_among_short(24, 16, 64, vocab_size=claims.VOCAB, seed=0, **claims.LONG)
print([r.label[0] for r in reqs])
print(claims.workload_counts(), "| package generator vs frozen:", claims.frozen_matches())

# %% [markdown]
# ## 2. How each budget cuts the long prompt
#
# Seven short requests are decoding when the long prompt arrives. Each step gives the seven
# their token first, then the prompt gets what is left of the budget. Without chunking the
# prompt goes whole, in its own forward, in one step.

# %%
for arm, chunks in claims.steps().items():
    print(f"{arm:>4}: {len(chunks):2d} steps, prompt tokens per step {chunks}")

# %% [markdown]
# ## 3. What a step with a chunk costs
#
# The same seven streams and the same long prompt on each arm's engine in this process (one
# torch thread, best of three rounds). A stream waits for the whole step that carries a chunk, so
# the step time is the gap that stream's client sees, before HTTP adds its share.

# %%
for arm, m in claims.engine_steps().items():
    steps_ms = ", ".join(f"{s * 1e3:.1f}" for s in m["chunk_steps_s"])
    print(f"{arm:>4}: decode-only step {m['decode_s'] * 1e3:5.2f} ms; steps carrying the prompt "
          f"[{steps_ms}] ms; prefill {m['prefill_s'] * 1e3:.0f} ms")

# %% [markdown]
# ## 4. One round over HTTP, with a wider sweep of budgets
#
# One `nanoserve serve` per setting (nanoserve-tiny, float32, 8 slots), all started together;
# the workload goes to each at rate 8 (Poisson) and then at rate inf. One round on a shared
# machine is noisy; the claims take the median of three rounds' ratios.

# %%
arms = {**claims.ARMS, "1024": ("--max-num-batched-tokens", "1024")}
(round0,) = measure(arms, 1, claims._bench([claims.RATE, math.inf]))
cols = ["off", "1024", "512", "256", "128", "64"]
rows = [
    ("p99 ITL, rate 8 (ms)", lambda x: x[0]["p99_itl_ms"]),
    ("median ITL, rate 8 (ms)", lambda x: x[0]["median_itl_ms"]),
    ("long: median TTFT, rate 8 (ms)", claims.long_ttft),
    ("short: median TTFT, rate 8 (ms)", claims.short_ttft),
    ("output tok/s, rate inf", claims.saturated_throughput),
    ("failed, both rates", lambda x: x[0]["failed"] + x[1]["failed"]),
]
print(f"{'':32s}" + "".join(f"{c:>9s}" for c in cols))
for label, value in rows:
    print(f"{label:32s}" + "".join(f"{value(round0[c]):9.1f}" for c in cols))

# %% [markdown]
# What to read in it: among the chunked arms the p99 ITL follows the largest step a stream has
# to wait through, so it falls as the budget falls. Against chunking off it need not: off stalls
# each running stream once per long prompt, and its stalls can be too few to reach the 99th
# percentile of the pooled gaps. The median ITL (most steps carry no prompt at all) barely
# moves. The long prompts pay the other way: the smaller the budget, the more steps their
# prefill is spread over, and every one of those steps also carries seven decodes. The short
# prompts' TTFT and the saturated throughput hardly depend on the budget in this workload,
# because the prompt chunks ride along in steps the streams needed anyway.
