"""Day 34 snapshot (frozen): what batchbench reports about preemption, from plain records.

Each record is one request: how often it was preempted, and when it arrived and was handed back.
The engine-wide counters give the recompute bill: tokens re-prefilled on resume, against every
token position the model computed. Pure standard library, so the arithmetic cannot drift.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    preemptions: int
    arrival_time: float
    finished_time: float

    @property
    def latency(self) -> float:
        return self.finished_time - self.arrival_time


def report(records: list[Record], recomputed_tokens: int, tokens_computed: int) -> dict:
    hit = [r for r in records if r.preemptions]
    straight = [r for r in records if not r.preemptions]
    return {
        "preemptions": sum(r.preemptions for r in records),
        "preemptions_per_request": round(sum(r.preemptions for r in records) / len(records), 3),
        "preempted_requests": len(hit),
        "recompute_share": recomputed_tokens / tokens_computed,
        "latency_preempted": statistics.mean(r.latency for r in hit) if hit else None,
        "latency_straight": statistics.mean(r.latency for r in straight) if straight else None,
    }
