"""Day 35's numbers: a long stress run on nanoserve-tiny, every count exact.

Workload: 40 requests, seed 7, prompts of 2-20 random tokens, 1-40 greedy tokens each with EOS
ignored, block_size 4, 8 slots, a 16-block pool, and a 5% chance per iteration of aborting a
random live request. The roomy engine (default pool) is the reference.
"""

from __future__ import annotations

import functools
import json
import random

from chapters.common import SHIPPED
from chapters.runner import exact

from .snapshot.verdict import mismatches

REQUESTS, SEED, BLOCKS, BS, SLOTS, ABORT = 40, 7, 16, 4, 8, 0.05


@functools.cache
def stress() -> dict:
    from nanoserve.bench.stress import run_stress

    return run_stress(SHIPPED, requests=40, seed=7, num_kv_blocks=16, abort_rate=0.05)


@functools.cache
def replay() -> dict:
    """run_stress's cramped half, host-only: the live scheduler over integer tokens with the
    same workload, abort stream and loop, and no model. With EOS ignored the schedule depends
    only on lengths, so it must reproduce the run's counts (a claim checks that); it also
    records what the run does not report: what each abort hit, how many requests ran at once,
    and how soon after its admission or resume each victim was preempted. The figure draws it."""
    from nanoserve.bench.batchbench import workload
    from nanoserve.engine.kv_manager import KVCacheManager
    from nanoserve.engine.request import Request, RequestState
    from nanoserve.engine.scheduler import Scheduler

    vocab = json.loads((SHIPPED / "config.json").read_text())["vocab_size"]
    prompts, gens = workload(REQUESTS, SEED, (2, 20), (1, 40), vocab)
    sched = Scheduler(KVCacheManager(BLOCKS, BS), SLOTS, allocation="incremental")
    reqs = [Request(i, p, max_tokens=g) for i, (p, g) in enumerate(zip(prompts, gens,
                                                                       strict=True))]
    for r in reqs:
        sched.add(r)
    rng = random.Random(SEED + 1)
    lanes = [[] for _ in reqs]  # (iteration, "prefill" | "decode")
    preempted, aborted, rows, held, hit = [], [], [], [], []
    since = {}  # request -> the iteration it was last admitted or resumed
    it = checks = 0
    while True:
        sched.check_invariants()
        checks += 1
        live = [r for r in reqs if r.state is not RequestState.FINISHED]
        if live and rng.random() < ABORT:
            victim = rng.choice(live)
            hit.append("running" if victim.state is RequestState.RUNNING
                       else "preempted" if victim.num_preemptions else "never started")
            sched.abort(victim)
            aborted.append((it + 1, victim.request_id))
        out = sched.schedule()
        if out.num_scheduled == 0:
            break
        it += 1
        preempted += [(it, r.request_id, it - since[r.request_id]) for r in out.preempted]
        for r in out.admitted:
            lanes[r.request_id].append((it, "prefill"))
            since[r.request_id] = it
        for r in out.decode:
            lanes[r.request_id].append((it, "decode"))
        rows.append(out.num_scheduled)
        held.append(sched.kv_cache_manager.num_held)
        for r in out.admitted + out.decode:
            r.append_token(1)
    return {"lanes": lanes, "preempted": preempted, "aborted": aborted, "rows": rows,
            "held": held, "iterations": it, "checks": checks, "hit": hit,
            "recomputed": sched.recomputed_tokens}


def replay_matches() -> str:
    r, s = replay(), stress()
    same = ((len(r["preempted"]), r["recomputed"], len(r["aborted"]), r["checks"],
             r["iterations"]) == (s["preemptions"], s["recomputed_tokens"], s["aborted"],
                                  s["invariant_checks"], s["iterations"]))
    return "identical" if same else "different"


def abort_targets() -> str:
    hit = replay()["hit"]
    return ", ".join(f"{hit.count(k)} {k}" for k in ("never started", "running", "preempted"))


def early_preemptions() -> str:
    """Preemptions within two iterations of the victim's admission or resume."""
    pre = replay()["preempted"]
    return f"{sum(gap <= 2 for _, _, gap in pre)} of {len(pre)}"


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
    exact("iterations", lambda: stress()["iterations"]),
    exact("the run replayed host-only: preemptions, tokens re-prefilled, aborts, checks, "
          "iterations against the run's", replay_matches),
    exact("what the aborts hit (replay)", abort_targets),
    exact("most requests scheduled in one iteration (replay)", lambda: max(replay()["rows"])),
    exact("preemptions within two iterations of the victim's admission or resume (replay)",
          early_preemptions),
    exact("the verdict rule on a hand-made case (an aborted prefix passes, a changed token "
          "fails)", lambda: str(mismatches([[1, 2], [1], [1, 3]], [False, True, False],
                                           [[1, 2], [1, 2], [1, 2]]))),
]
