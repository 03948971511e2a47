"""Day 59 snapshot (frozen): the arms, and inter-token latency split into its middle and its tail.

A replayed decode step shortens the gap between two tokens of a request that is already
running; a warm-up, a compilation or a step that also prefills a newcomer lengthens a few gaps
a lot. Averaged together the two effects blur into one number that says neither, so the
benchmark reports the pooled gaps' p50 (where a replay shows) and p99 (where the stragglers
live) side by side and never their mean.

Gaps are pooled over every successful request (a long answer weighs more), and a percentile
interpolates linearly between ranks, Day 40's arithmetic:

    >>> itl_split([[0.010, 0.011, 0.012], [0.010, 0.250]])
    (11.0, 240.48)

Each arm is one server, and the arms differ in one flag at a time; every arm keeps the
persistent batch so the first two differ only in the windows:

    >>> ARMS["graphs"], ARMS["no-compile"]
    (('--cuda-graphs', '--compile', '--persistent-batch'), ('--no-compile', '--persistent-batch'))
    >>> replay_share("nanoserve:decode_steps_replayed_total 30.0\\n"
    ...              "nanoserve:decode_steps_scattered_total 10.0\\n")
    0.75
"""

from __future__ import annotations

import re

from chapters.day40_serving_bench.snapshot.metrics import percentile

ARMS = {
    "graphs": ("--cuda-graphs", "--compile", "--persistent-batch"),
    "eager": ("--compile", "--persistent-batch"),
    "no-compile": ("--no-compile", "--persistent-batch"),
}


def itl_split(gaps_per_request: list[list[float]]) -> tuple[float, float]:
    """Seconds per gap, one list per successful request -> (p50, p99) in milliseconds."""
    pooled = [g for gaps in gaps_per_request for g in gaps]
    if not pooled:
        return 0.0, 0.0
    return (round(percentile(pooled, 50) * 1e3, 6), round(percentile(pooled, 99) * 1e3, 6))


def replay_share(metrics_text: str) -> float:
    """Replayed over all decode steps, from a server's ``/metrics`` page."""
    counts = {}
    for key in ("replayed", "scattered"):
        pat = rf"^nanoserve:decode_steps_{key}_total(?:{{[^}}]*}})? ([0-9.e+]+)$"
        counts[key] = sum(float(m) for m in re.findall(pat, metrics_text, re.M))
    total = counts["replayed"] + counts["scattered"]
    return counts["replayed"] / total if total else 0.0
