"""Day 40 snapshot (frozen): what the serving benchmark computes from what the client saw.

For one request the client records the time to its first content chunk (``ttft``), the gaps
between later chunks (``itl``), the time until the stream closed (``latency``) and the number of
output tokens (from the final usage). From those:

- TTFT and E2EL are ``ttft`` and ``latency`` themselves;
- TPOT, time per output token after the first: ``(latency - ttft) / (output_tokens - 1)``,
  only for requests with more than one token;
- ITL pools every gap of every request, so a long answer weighs more than a short one.

Each is summarised as mean, population std, median and p99 in milliseconds, where a percentile
interpolates linearly between the two nearest ranks (numpy's default):

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), round(percentile([1.0, 2.0, 3.0, 4.0], 99), 6)
    (2.5, 3.97)

Arrivals: a request is sent at the running sum of the intervals before it, so the schedule is
fixed up front and a late wake-up does not push back every later request.

    >>> arrival_times([0.5, 0.25, 1.0])
    [0.0, 0.5, 0.75]
"""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def std(values: list[float]) -> float:
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def tpot(latency: float, ttft: float, output_tokens: int) -> float:
    return (latency - ttft) / (output_tokens - 1)


def summarize(requests: list[tuple[float, list[float], float, int]]) -> dict[str, float]:
    """``(ttft, itl gaps, latency, output_tokens)`` per successful request, in seconds ->
    ``{mean,std,median,p99}_{ttft,tpot,itl,e2el}_ms``; an empty series summarises as 0."""
    series = {
        "ttft": [r[0] for r in requests],
        "tpot": [tpot(r[2], r[0], r[3]) for r in requests if r[3] > 1],
        "itl": [gap for r in requests for gap in r[1]],
        "e2el": [r[2] for r in requests],
    }
    out = {}
    for name, values in series.items():
        ms = [v * 1000 for v in values] or [0.0]
        out |= {f"mean_{name}_ms": mean(ms), f"std_{name}_ms": std(ms),
                f"median_{name}_ms": percentile(ms, 50), f"p99_{name}_ms": percentile(ms, 99)}
    return out


def arrival_times(intervals: list[float]) -> list[float]:
    times, t = [], 0.0
    for gap in intervals:
        times.append(t)
        t += gap
    return times
