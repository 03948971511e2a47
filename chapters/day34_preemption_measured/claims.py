"""Day 34's numbers: preemption in the measurement, on this CPU with nanoserve-tiny.

Workload (batchbench): 12 requests, seed 0, prompts of 4-24 random tokens, 8-40 greedy tokens
each with EOS ignored, block_size 4, 8 slots; a cramped pool of 24 blocks against the default.
The counts do not depend on timing or on what the model says: they are exact.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED, best_of
from chapters.runner import at_least, exact

from .snapshot.report import Record, report

KW = dict(dtype="float32", block_size=4, max_num_seqs=8)


@functools.cache
def runs() -> tuple[dict, dict, dict]:
    """(cramped report, cramped batchbench, roomy batchbench): after a warm-up, two interleaved
    rounds on one thread; each engine keeps its least disturbed run. The counts are the same in
    every round."""
    from nanoserve import LLM
    from nanoserve.bench.batchbench import run, workload

    cramped, roomy = LLM(SHIPPED, num_kv_blocks=24, **KW), LLM(SHIPPED, **KW)
    prompts, gens = workload(12, 0, (4, 24), (8, 40), cramped.config.vocab_size)
    run(cramped, prompts[:2], gens[:2])  # warm-up, outside the measurement
    run(roomy, prompts[:2], gens[:2])
    best = best_of(2, {"cramped": lambda: run(cramped, prompts, gens),
                       "roomy": lambda: run(roomy, prompts, gens)}, lambda r: r["wall_s"])
    bench_c, bench_r = best["cramped"], best["roomy"]
    records = [Record(n, 0.0, t) for n, t in zip(bench_c["preemptions_per_request"],
                                                 bench_c["latencies_s"], strict=True)]
    return report(records, bench_c["recomputed_tokens"], bench_c["tokens_computed"]), \
        bench_c, bench_r


def same_tokens() -> int:
    return sum(a == b for a, b in zip(runs()[1]["token_ids"], runs()[2]["token_ids"],
                                      strict=True))


CLAIMS = [
    exact("preemptions, cramped pool (24 blocks)", "11", lambda: runs()[0]["preemptions"]),
    exact("requests preempted at least once", "7 of 12",
          lambda: f"{runs()[0]['preempted_requests']} of 12"),
    exact("preemptions per request", "0.917", lambda: runs()[0]["preemptions_per_request"]),
    exact("recompute bill: share of all token positions computed", "35.8%",
          lambda: runs()[0]["recompute_share"], fmt="{:.1%}".format),
    exact("tokens identical, cramped vs roomy", "12 of 12", lambda: f"{same_tokens()} of 12"),
    at_least("mean latency, preempted / straight-through requests (same run, this CPU)",
             "> 1x", 1.0, lambda: runs()[0]["latency_preempted"] / runs()[0]["latency_straight"],
             fmt="{:.2f}x".format),
    at_least("wall clock, cramped / roomy, same workload (this CPU)", "≥ 1.1x", 1.1,
             lambda: runs()[1]["wall_s"] / runs()[2]["wall_s"], fmt="{:.1f}x".format),
    exact("preemptions in the roomy run", "0", lambda: runs()[2]["preemptions"]),
]
