"""The live package's token budget held against the frozen Day 41 snapshot, step by step.

Host-only: the package's ``Scheduler`` and the snapshot's are driven by the same frozen harness
(``chapters/day41_token_budget/snapshot/harness.py``) over integer tokens, on the chapter's
worked workload and on seeded random workloads that mix budgets (and none), chunking on and
off, both allocation policies, cramped pools that preempt, arrivals mid-run and aborts. Every
step's chunks, decodes, sampled requests, preemptions, releases, token count and blocks held
must agree. Without a budget the package must also still schedule as Day 33's snapshot did.
"""

from __future__ import annotations

import doctest

import pytest

from chapters.day41_token_budget import claims
from chapters.day41_token_budget.snapshot import harness


def test_the_worked_schedule_is_the_snapshots():
    live, snap = claims.worked("live"), claims.worked("snapshot")
    assert live == snap
    assert [s.tokens for s in live] == [12, 16, 16, 16, 8, 5, 5, 4]
    assert max(s.tokens for s in live) <= claims.BUDGET


def test_without_a_budget_the_worked_schedule_is_day33s():
    assert claims.worked("live", None) == claims.worked("day33")


@pytest.mark.parametrize("seed", list(claims.RANDOM_SEEDS)[:60])
def test_random_workload_matches_the_snapshot_step_by_step(seed):
    w = claims.random_workload(seed)
    live, snap = claims.random_trace(w, "live"), claims.random_trace(w, "snapshot")
    assert len(live) == len(snap)
    for i, (a, b) in enumerate(zip(live, snap, strict=True), 1):
        assert a == b, f"seed {seed}, step {i}: {a} != {b}"
        if w["budget"] is not None:
            assert a.tokens <= w["budget"]
    if w["budget"] is None:
        assert live == claims.random_trace(w, "day33")


def test_the_random_workloads_exercise_what_they_claim_to():
    shapes = [claims.random_workload(s) for s in claims.RANDOM_SEEDS]
    assert {w["budget"] is None for w in shapes} == {True, False}
    assert {w["chunked"] for w in shapes} == {True, False}
    assert {w["allocation"] for w in shapes} == {"incremental", "reserve"}
    assert any(w["aborts"] for w in shapes)
    got = claims.random_comparison()
    assert got["differ"] == 0 and got["preemptions"] > 0 and got["continued_chunks"] > 0


def test_the_harness_docstring_example():
    result = doctest.testmod(harness)
    assert result.attempted > 0 and result.failed == 0
