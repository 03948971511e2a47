"""Day 35's numbers: a long stress run on nanoserve-tiny, every count exact.

Workload: 40 requests, seed 7, prompts of 2-20 random tokens, 1-40 greedy tokens each with EOS
ignored, block_size 4, 8 slots, a 16-block pool, and a 5% chance per iteration of aborting a
random live request. The roomy engine (default pool) is the reference.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED
from chapters.runner import exact

from .snapshot.verdict import mismatches


@functools.cache
def stress() -> dict:
    from nanoserve.bench.stress import run_stress

    return run_stress(SHIPPED, requests=40, seed=7, num_kv_blocks=16, abort_rate=0.05)


CLAIMS = [
    exact("requests through the cramped pool", lambda: stress()["requests"]),
    exact("preemptions", lambda: stress()["preemptions"]),
    exact("tokens re-prefilled on resume", lambda: stress()["recomputed_tokens"]),
    exact("requests aborted during the run", lambda: stress()["aborted"]),
    exact("requests whose tokens differ from the roomy engine's",
          lambda: len(stress()["mismatched_requests"])),
    exact("scheduler invariant checks, one before every iteration",
          lambda: stress()["invariant_checks"]),
    exact("pool after the drain",
          lambda: "full" if stress()["pool_full_after_drain"] else "blocks missing"),
    exact("the verdict rule on a hand-made case (an aborted prefix passes, a changed token "
          "fails)", lambda: str(mismatches([[1, 2], [1], [1, 3]], [False, True, False],
                                           [[1, 2], [1, 2], [1, 2]]))),
]
