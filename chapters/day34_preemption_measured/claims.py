"""Day 34's numbers: preemption in the measurement, on this CPU with nanoserve-tiny.

Workload (batchbench): 12 requests, seed 0, prompts of 4-24 random tokens, 8-40 greedy tokens
each with EOS ignored, block_size 4, 8 slots; a cramped pool of 24 blocks against the default.
The counts do not depend on timing or on what the model says: they are exact.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED
from chapters.runner import at_least, exact

from .snapshot.report import Record, report

KW = dict(dtype="float32", block_size=4, max_num_seqs=8)


@functools.cache
def runs() -> tuple[dict, dict, dict]:
    """(cramped report, cramped batchbench, roomy batchbench)."""
    from nanoserve import LLM
    from nanoserve.bench.batchbench import run, workload

    cramped, roomy = LLM(SHIPPED, num_kv_blocks=24, **KW), LLM(SHIPPED, **KW)
    prompts, gens = workload(12, 0, (4, 24), (8, 40), cramped.config.vocab_size)
    run(cramped, prompts[:2], gens[:2])  # warm-up, outside the measurement
    before = (cramped.stats.recomputed_tokens, cramped.stats.tokens_computed)
    bench_c = run(cramped, prompts, gens)
    bench_r = run(roomy, prompts, gens)
    records = [Record(n, 0.0, t) for n, t in zip(bench_c["preemptions_per_request"],
                                                 bench_c["latencies_s"], strict=True)]
    rep = report(records, cramped.stats.recomputed_tokens - before[0],
                 cramped.stats.tokens_computed - before[1])
    return rep, bench_c, bench_r


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
