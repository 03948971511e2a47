# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 40 notebook: the serving benchmark, reduced
#
# `nanoserve bench serve` is vLLM's `benchmark_serving` for nanoserve: a seeded workload sent
# over HTTP at a chosen request rate, timed by the client. Here, on a CPU in well under a
# minute:
#
# 1. the workload and the arrival schedule, drawn from one seed;
# 2. a reduced run against the Day 38 server on 127.0.0.1 (a free port, a thread of this
#    process; nanoserve-tiny, float32, 4 slots): rate 4, rate inf, and rate inf with
#    `max_concurrency` 2, 12 requests each;
# 3. the same numbers recomputed by the frozen Day 40 arithmetic.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import os
import platform

import nanoserve.bench.serve as bs
from chapters.day38_server.live import live_server
from chapters.day40_serving_bench.snapshot import metrics as frozen
from nanoserve.bench.workload import arrival_times, random_requests, request_intervals

print(platform.machine(), os.cpu_count(), "cores;", platform.python_version())

# %% [markdown]
# ## 1. The workload and when it is sent
#
# vLLM's *random* dataset: prompts of uniform random token ids (32 each here), each asking for
# 16 tokens with EOS ignored, so every request produces exactly its budget. Intervals between
# requests are gamma-distributed with shape `burstiness` and mean `1 / rate`: burstiness 1 is a
# Poisson process, lower values bunch the arrivals up. The send times are the running sum of the
# intervals, fixed before the first request goes out.

# %%
reqs = random_requests(12, 32, 16, 0.0, vocab_size=2048, seed=0)
print("prompt lengths:", [r.prompt_len for r in reqs][:6], "... first ids:", reqs[0].prompt[:8])
for b in (1.0, 0.25):
    gaps = request_intervals(10_000, 4.0, burstiness=b, seed=0)
    print(f"burstiness {b}: mean gap {frozen.mean(gaps):.3f} s, "
          f"CV {frozen.std(gaps) / frozen.mean(gaps):.2f}")
print("send times at rate 4:", [round(t, 2) for t in arrival_times(12, 4.0, 1.0, seed=0)])

# %% [markdown]
# ## 2. A reduced run
#
# The client streams every request (`stream: true`, `include_usage`) and times chunks as they
# come off the socket: TTFT to the first content chunk, ITL between chunks, E2EL to the end of
# the stream, TPOT = (E2EL - TTFT) / (output tokens - 1). `calculate_metrics` is wrapped so the
# per-request records stay available for section 3.

# %%
records = []
original = bs.calculate_metrics


def recording(outputs, duration_s):
    records.append(list(outputs))
    return original(outputs, duration_s)


bs.calculate_metrics = recording
results = []
try:
    with live_server(max_num_seqs=4, num_kv_blocks=256, block_size=4) as live:
        for rate, mc in ((4.0, None), (float("inf"), None), (float("inf"), 2)):
            results += bs.run_bench(live.url, rates=[rate], max_concurrency=mc, requests=12,
                                    input_len=32, output_len=16, seed=0)
finally:
    bs.calculate_metrics = original

rows = ["completed", "failed", "duration_s", "total_output_tokens", "request_throughput",
        "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "median_e2el_ms"]
names = [f"rate {r['rate']}" + (" mc2" if r["max_concurrency"] else "") for r in results]
print(f"{'':22s}" + "".join(f"{n:>16s}" for n in names))
for k in rows:
    print(f"{k:22s}" + "".join(f"{r[k]:16.2f}" if isinstance(r[k], float) else f"{r[k]:16d}"
                               for r in results))

# %% [markdown]
# What to read in it: at rate inf all twelve requests arrive at once and only four fit in the
# batch, so eight wait and the median TTFT grows by a large factor, while output throughput rises
# because the batch is full the whole time. `max_concurrency` 2 caps the requests in flight on the
# client side: the queue moves into the client, where waiting is not timed, so TTFT drops back and
# throughput sits between the two. TPOT grows with the batch: each decode step carries more rows,
# and newcomers' prefills run in between, so a token costs more wall time while the batch is full.
#
# ## 3. The frozen arithmetic
#
# `snapshot/metrics.py` recomputes every mean, std, median and p99 from the same records in plain
# Python. It must agree with the package's numpy version to rounding error.

# %%
worst = 0.0
for r, recs in zip(results, records, strict=True):
    ok = [(o.ttft, o.itl, o.latency, o.output_tokens) for o in recs if o.success]
    again = frozen.summarize(ok)
    worst = max(worst, max(abs(again[k] - r[k]) for k in again))
    print(f"rate {r['rate']}: {len(ok)} requests, {sum(len(o.itl) for o in recs)} ITL gaps, "
          f"median TPOT {again['median_tpot_ms']:.2f} ms (package {r['median_tpot_ms']:.2f})")
print(f"largest difference, frozen vs package: {worst:.2e} ms")
