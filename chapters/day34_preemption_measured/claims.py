"""Day 34's numbers: preemption in the measurement, on this CPU with nanoserve-tiny.

Workload (batchbench): 12 requests, seed 0, prompts of 4-24 random tokens, 8-40 greedy tokens
each with EOS ignored, block_size 4, 8 slots; a cramped pool of 24 blocks against the default.
The counts do not depend on timing or on what the model says: they are exact.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED, best_of
from chapters.runner import exact, timed

from .snapshot.report import Record, report

KW = dict(dtype="float32", block_size=4, max_num_seqs=8)


def _engines():
    from nanoserve import LLM
    from nanoserve.bench.batchbench import workload

    cramped, roomy = LLM(SHIPPED, num_kv_blocks=24, **KW), LLM(SHIPPED, **KW)
    prompts, gens = workload(12, 0, (4, 24), (8, 40), cramped.config.vocab_size)
    return cramped, roomy, prompts, gens


def _report(bench: dict) -> dict:
    records = [Record(n, 0.0, t) for n, t in zip(bench["preemptions_per_request"],
                                                 bench["latencies_s"], strict=True)]
    return report(records, bench["recomputed_tokens"], bench["tokens_computed"])


@functools.cache
def counted() -> tuple[dict, dict, dict]:
    """(cramped report, cramped batchbench, roomy batchbench) from one untimed run each: the
    counts do not depend on the clock."""
    from nanoserve.bench.batchbench import run

    cramped, roomy, prompts, gens = _engines()
    bench_c, bench_r = run(cramped, prompts, gens), run(roomy, prompts, gens)
    return _report(bench_c), bench_c, bench_r


@functools.cache
def runs() -> tuple[dict, dict, dict]:
    """The same, for the times: after a warm-up, three interleaved rounds on one thread; each
    engine keeps its least disturbed run."""
    from nanoserve.bench.batchbench import run

    cramped, roomy, prompts, gens = _engines()
    run(cramped, prompts[:2], gens[:2])  # warm-up, outside the measurement
    run(roomy, prompts[:2], gens[:2])
    best = best_of(3, {"cramped": lambda: run(cramped, prompts, gens),
                       "roomy": lambda: run(roomy, prompts, gens)}, lambda r: r["wall_s"])
    return _report(best["cramped"]), best["cramped"], best["roomy"]


def same_tokens() -> int:
    return sum(a == b for a, b in zip(counted()[1]["token_ids"], counted()[2]["token_ids"],
                                      strict=True))


CLAIMS = [
    exact("preemptions, cramped pool (24 blocks)", lambda: counted()[0]["preemptions"]),
    exact("requests preempted at least once",
          lambda: f"{counted()[0]['preempted_requests']} of 12"),
    exact("preemptions per request", lambda: counted()[0]["preemptions_per_request"]),
    exact("recompute bill: share of all token positions computed",
          lambda: counted()[0]["recompute_share"], fmt="{:.1%}".format),
    exact("tokens identical, cramped vs roomy", lambda: f"{same_tokens()} of 12"),
    timed("mean latency, preempted / straight-through requests (same run, this CPU)",
          lambda: runs()[0]["latency_preempted"] / runs()[0]["latency_straight"],
          fmt="{:.2f}x".format),
    timed("wall clock, cramped / roomy, same workload (this CPU)",
          lambda: runs()[1]["wall_s"] / runs()[2]["wall_s"], fmt="{:.2f}x".format),
    exact("preemptions in the roomy run", lambda: counted()[2]["preemptions"]),
]
