"""The serving benchmark's arithmetic: what the client saw, summarised as vLLM summarises it.

Why this module exists: the numbers of ``nanoserve bench serve`` must mean what vLLM's mean, and
that is arithmetic, testable without a server. ``RequestFuncOutput`` is one request as the
client saw it (``serve.py`` fills it in off the socket); ``calculate_metrics`` turns one rate's
records into vLLM's keys; ``server_counters`` reads the counters a server keeps of its own work
(prefix-cache queries and hits, preemptions) from its Prometheus text, so a run can report what
the server computed beside what the client waited for.

- TTFT, time to first token: request sent -> first content chunk read;
- ITL, inter-token latency: the gaps between content chunks, pooled over all requests;
- TPOT, time per output token: ``(e2el - ttft) / (output_tokens - 1)`` per request;
- E2EL, end-to-end latency: request sent -> stream closed;
- request, output-token and total-token throughput over the rate's wall time.

Percentiles are numpy's (linear interpolation).

>>> m = calculate_metrics([RequestFuncOutput(True, 10, 3, ttft=0.1, itl=[0.02, 0.04],
...                                          latency=0.2)], duration_s=1.0)
>>> m["completed"], m["output_throughput"], round(m["mean_tpot_ms"], 6), m["median_itl_ms"]
(1, 3.0, 50.0, 30.0)
>>> server_counters('vllm:prefix_cache_hits_total{model_name="m"} 48.0\\n')
{'prefix_cache_hits': 48}
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass, field

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
# Counters an engine keeps of its own work, under vLLM's names after the ``prefix:`` (vllm:,
# nanoserve:); Prometheus text spells a counter with ``_total``.
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_evicted_blocks",
            "num_preemptions")
_COUNTER = re.compile(r"^[A-Za-z_][\w]*:(?P<name>" + "|".join(COUNTERS) +
                      r")_total(?:\{[^}]*\})?\s+(?P<value>\S+)\s*$", re.M)


@dataclass(slots=True)
class RequestFuncOutput:
    """What the client saw of one request (vLLM's name). Times in seconds."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    error: str = ""


def _stats(name: str, values: list[float]) -> dict:
    """mean, std, median and p99 of ``values`` seconds, as vLLM's ``*_ms`` keys (0 when empty)."""
    ms = np.asarray(values, dtype=float) * 1000 if values else np.zeros(1)
    return {f"mean_{name}_ms": float(np.mean(ms)), f"std_{name}_ms": float(np.std(ms)),
            f"median_{name}_ms": float(np.median(ms)),
            f"p99_{name}_ms": float(np.percentile(ms, 99))}


def calculate_metrics(outputs: list[RequestFuncOutput], duration_s: float) -> dict:
    """vLLM's metrics over one rate's requests; failed requests count only in ``failed``."""
    ok = [o for o in outputs if o.success]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    series = {
        "ttft": [o.ttft for o in ok],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1],
        "itl": [gap for o in ok for gap in o.itl],
        "e2el": [o.latency for o in ok],
    }
    m = {
        "completed": len(ok), "failed": len(outputs) - len(ok), "duration_s": duration_s,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
    }
    for name in METRICS:
        m |= _stats(name, series[name])
    errors = collections.Counter(o.error for o in outputs if not o.success)
    m["errors"] = dict(errors.most_common(5))  # why requests failed, the five commonest
    return m


def server_counters(text: str) -> dict[str, int]:
    """The ``COUNTERS`` a server's ``/metrics`` text shows, summed over their labels."""
    out: dict[str, int] = {}
    for m in _COUNTER.finditer(text):
        value = float(m["value"])
        if math.isfinite(value):
            out[m["name"]] = out.get(m["name"], 0) + int(value)
    return out


ROWS = [  # (label, key, format) of the table, in vLLM's order
    ("Successful requests", "completed", "{:d}"),
    ("Failed requests", "failed", "{:d}"),
    ("Benchmark duration (s)", "duration_s", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:d}"),
    ("Total generated tokens", "total_output_tokens", "{:d}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
] + [(f"{stat.capitalize()} {name.upper()} (ms)", f"{stat}_{name}_ms", "{:.2f}")
     for name in METRICS for stat in ("mean", "median", "p99")]


def rounded(results: list[dict], ndigits: int = 2) -> list[dict]:
    """The results as the table shows them: floats to ``ndigits`` places."""
    def one(v):
        if isinstance(v, float) and math.isfinite(v):
            return round(v, ndigits)
        return {k: one(x) for k, x in v.items()} if isinstance(v, dict) else v

    return [{k: one(v) for k, v in r.items()} for r in results]


def print_table(results: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for r in results:
        table.add_column(f"rate {r['rate']}", justify="right")
    for label, key, fmt in ROWS:
        table.add_row(label, *(fmt.format(r[key]) for r in results))
    for name in COUNTERS:  # what the server says it did, where it says so
        if all(name in r.get("server_counters", {}) for r in results):
            table.add_row(f"Server {name.replace('_', ' ')}",
                          *(f"{r['server_counters'][name]:d}" for r in results))
    Console(stderr=True).print(table)
