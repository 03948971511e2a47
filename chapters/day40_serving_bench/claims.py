"""Day 40's numbers: a reduced serving benchmark over HTTP against a real server on 127.0.0.1.

The server (``chapters/day38_server/live.py``): nanoserve-tiny in float32 behind ``build_app``,
uvicorn on a free port of 127.0.0.1 in a thread, one torch thread, 4 slots, a 256-block pool of
block_size 4. The client: ``nanoserve.bench.serve.run_bench`` (httpx, streaming completions,
greedy, EOS ignored), 12 requests of 32 random prompt ids and 16 output tokens, seed 0, three
runs: Poisson arrivals at 4 requests/s, everything at once (rate inf), and rate inf with
``max_concurrency`` 2. ``calculate_metrics`` is wrapped for the run so the per-request records
behind each row of the table can be held against the frozen arithmetic.
"""

from __future__ import annotations

import functools
import math

from chapters.runner import exact, timed

from .snapshot.metrics import arrival_times, mean, std, summarize

WORKLOAD = dict(requests=12, input_len=32, output_len=16, seed=0)
RUNS = [(4.0, None), (math.inf, None), (math.inf, 2)]  # (rate, max_concurrency)


@functools.cache
def bench() -> list[tuple[dict, list]]:
    """(metrics, records) per run; records are the RequestFuncOutputs behind the metrics."""
    import nanoserve.bench.serve as bs
    from chapters.day38_server.live import live_server

    out = []
    with live_server(max_num_seqs=4, num_kv_blocks=256, block_size=4) as live:
        core, step = live.engine.core, live.engine.core.step
        peak = [0]

        def counted_step():
            peak[0] = max(peak[0], core.num_running)
            return step()

        original = bs.calculate_metrics
        seen = []

        def recording(outputs, duration_s):
            seen.append(list(outputs))
            return original(outputs, duration_s)

        core.step, bs.calculate_metrics = counted_step, recording
        try:
            for rate, mc in RUNS:
                peak[0] = 0
                (m,) = bs.run_bench(live.url, rates=[rate], max_concurrency=mc, **WORKLOAD)
                out.append((m | {"peak_running": peak[0]}, seen[-1]))
                live.idle()
        finally:
            core.step, bs.calculate_metrics = step, original
    return out


def per_run(key: str, fmt=str) -> str:
    return ", ".join(fmt(m[key]) for m, _ in bench())


def frozen_disagreements() -> str:
    """Values where the frozen summary and calculate_metrics differ by more than 1e-9 ms."""
    bad = total = 0
    for m, records in bench():
        ok = [(o.ttft, o.itl, o.latency, o.output_tokens) for o in records if o.success]
        for key, value in summarize(ok).items():
            total += 1
            bad += abs(value - m[key]) > 1e-9
    return f"{bad} of {total}"


def itl_gaps() -> str:
    return ", ".join(str(sum(len(o.itl) for o in records if o.success))
                     for _, records in bench())


def intervals() -> str:
    """Mean gap and coefficient of variation of 10,000 seeded gaps at rate 4."""
    from nanoserve.bench.workload import request_intervals

    cells = []
    for b in (1.0, 0.25):
        gaps = request_intervals(10_000, 4.0, burstiness=b, seed=0)
        cells.append(f"{mean(gaps):.3f} s, CV {std(gaps) / mean(gaps):.2f}")
    return "; ".join(cells)


def frozen_arrivals() -> str:
    from nanoserve.bench.workload import arrival_times as live_arrivals
    from nanoserve.bench.workload import request_intervals

    gaps = request_intervals(12, 4.0, 1.0, seed=0)
    same = sum(a == b for a, b in zip(arrival_times(gaps), live_arrivals(12, 4.0, 1.0, seed=0),
                                      strict=True))
    return f"{same} of 12"


def record(path: str = "chapters/day40_serving_bench/results/example-run.json") -> dict:
    """Write one run of the three benchmarks as the results file the README's example table
    quotes: the machine, the date, the command and every metric of each run."""
    import datetime
    import json
    from pathlib import Path

    import torch

    from chapters.common import hardware

    names = ["rate 4", "rate inf", "rate inf, max_concurrency 2"]
    data = {
        "machine": hardware(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python -c 'from chapters.day40_serving_bench.claims import record; "
                   "record()'",
        "workload": WORKLOAD | {"runs": names, "server": "nanoserve-tiny, float32, one torch "
                                "thread, 4 slots, 256 blocks of 4"},
        "values": {n: {k: v for k, v in m.items() if isinstance(v, int | float)}
                   for n, (m, _) in zip(names, bench(), strict=True)},
    }
    Path(path).parent.mkdir(exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


def last_send() -> str:
    """When the seeded rate-4 schedule sends its last request: the length of that run, whatever
    the machine."""
    from nanoserve.bench.workload import arrival_times as live_arrivals

    return f"{live_arrivals(12, 4.0, 1.0, seed=0)[-1]:.2f} s"


def ratio(key: str, a: int, b: int) -> float:
    return bench()[a][0][key] / bench()[b][0][key]


CLAIMS = [
    exact("requests completed: rate 4, rate inf, rate inf with max_concurrency 2",
          lambda: per_run("completed")),
    exact("requests failed, same three runs", lambda: per_run("failed")),
    exact("input tokens, same three runs", lambda: per_run("total_input_tokens")),
    exact("output tokens (final usage chunk), same three runs",
          lambda: per_run("total_output_tokens")),
    exact("ITL gaps pooled, same three runs", itl_gaps),
    exact("peak requests running on the server: rate inf, then max_concurrency 2",
          lambda: "{}, then {}".format(bench()[1][0]["peak_running"],
                                       bench()[2][0]["peak_running"])),
    exact("metric values where the frozen arithmetic differs from calculate_metrics",
          frozen_disagreements),
    exact("10,000 seeded intervals at rate 4: burstiness 1, then 0.25", intervals),
    exact("arrival times, frozen running sum vs the package, 12 requests at rate 4",
          frozen_arrivals),
    exact("the seeded schedule's last send time, 12 requests at rate 4", last_send),
    timed("output throughput, rate inf / rate 4, same run",
          lambda: ratio("output_throughput", 1, 0), fmt="{:.1f}x".format),
    timed("median TTFT, rate inf / rate 4, same run",
          lambda: ratio("median_ttft_ms", 1, 0), fmt="{:.1f}x".format),
    timed("median TTFT at rate 4, 2-core CPU", lambda: bench()[0][0]["median_ttft_ms"] / 1e3,
          fmt=lambda s: f"{s * 1e3:.1f} ms"),
]
