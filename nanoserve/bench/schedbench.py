"""The scheduler without a model: every decision counted, nothing timed.

Why this module exists: a scheduler's job is bookkeeping, and bookkeeping can be measured exactly
without a forward pass. This harness drives the real ``Scheduler`` over a real
``KVCacheManager`` with integer tokens: a prefill produces a request's first token, and every
running request gets one more token per iteration. What comes out are counts (iterations,
row-steps, occupancy, the iteration each request finished), the same on every machine.

Conventions, pinned: an *iteration* is one ``schedule()`` followed by one model step; it counts
as a forward pass when it schedules at least one request. *Issued* counts the rows a forward
computes; *useful* counts tokens a request keeps. ``--batching static`` counts the same workload
as waves of ``slots`` requests that each run until their longest member is done.
``--policy incremental`` (Day 33) adds preemption: ``preemptions``, ``recomputed_tokens`` (tokens
re-prefilled on resume) and the two wastes, averaged over the iterations that ran the model.
The file is ``schedbench.py``, not ``sched.py``: a script run from this folder
(``vllm_runner.py``) would otherwise import it in place of the standard library's ``sched``.

    nanoserve bench sched --slots 8 --block-size 4 --pool-tokens 512 --prompt-len 5 \\
        --gen-lens 4,4,4,4,4,4,4,32 --requests 24 --policy reserve --json
"""

from __future__ import annotations

import argparse
import json

from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler

TOKEN = 1  # every generated token; the host-only harness never looks at values


def run_scheduled(slots: int, block_size: int, pool_tokens: int, prompt_len: int,
                  gen_lens: list[int], requests: int, policy: str = "reserve") -> dict:
    if pool_tokens % block_size:
        raise ValueError(f"pool_tokens={pool_tokens} is not a multiple of "
                         f"block_size={block_size}")
    pool = KVCacheManager(pool_tokens // block_size, block_size)
    sched = Scheduler(pool, slots, allocation=policy)
    reqs = [Request(i, [TOKEN] * prompt_len, max_tokens=gen_lens[i % len(gen_lens)])
            for i in range(requests)]
    for r in reqs:
        sched.add(r)
    finish_iteration = [0] * requests
    forward_passes = issued = 0
    reservation, fragmentation, peak_blocks = [], [], 0
    while True:
        out = sched.schedule()
        if out.num_scheduled == 0:
            if sched.has_unfinished():
                raise RuntimeError("nothing schedulable while requests wait: a deadlock")
            break  # this last call only handed back the final answers
        forward_passes += 1
        peak_blocks = max(peak_blocks, pool.num_held)
        reservation.append(sched.reservation_waste())
        fragmentation.append(sched.fragmentation_waste())
        for r in out.admitted + out.decode:
            issued += 1
            if r.append_token(TOKEN):
                finish_iteration[r.request_id] = forward_passes
        sched.check_invariants()
    assert pool.num_free == pool.num_blocks, "a block leaked"
    useful = sum(len(r.output_token_ids) for r in reqs)
    return {
        "batching": "continuous", "policy": policy, "slots": slots, "block_size": block_size,
        "pool_tokens": pool_tokens, "prompt_len": prompt_len, "gen_lens": gen_lens,
        "requests": requests, "forward_passes": forward_passes,
        "schedule_calls": sched.schedule_calls, "useful_tokens": useful,
        "issued_tokens": issued, "occupancy": round(useful / (forward_passes * slots), 4),
        "finish_iteration": finish_iteration,
        "blocked_on_slots": sched.blocked_on_slots, "blocked_on_blocks": sched.blocked_on_blocks,
        "peak_blocks_held": peak_blocks, "preemptions": sched.preemptions,
        "recomputed_tokens": sched.recomputed_tokens,
        # mean over the iterations that ran the model
        "reservation_waste": round(sum(reservation) / forward_passes, 4),
        "fragmentation_waste": round(sum(fragmentation) / forward_passes, 4),
        "preemptions_per_request": [r.num_preemptions for r in reqs],
    }


def run_static(slots: int, prompt_len: int, gen_lens: list[int], requests: int) -> dict:
    """Waves of ``slots`` requests; a wave runs until its longest member is done."""
    wants = [gen_lens[i % len(gen_lens)] for i in range(requests)]
    forward_passes = issued = 0
    finish_iteration, returned_iteration = [], []
    for w in range(0, requests, slots):
        wave = wants[w:w + slots]
        finish_iteration += [forward_passes + n for n in wave]
        forward_passes += max(wave)
        issued += len(wave) * max(wave)
        returned_iteration += [forward_passes] * len(wave)
    useful = sum(wants)
    return {
        "batching": "static", "slots": slots, "prompt_len": prompt_len, "gen_lens": gen_lens,
        "requests": requests, "forward_passes": forward_passes, "useful_tokens": useful,
        "issued_tokens": issued, "occupancy": round(useful / (forward_passes * slots), 4),
        "finish_iteration": finish_iteration, "returned_iteration": returned_iteration,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--pool-tokens", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=5)
    p.add_argument("--gen-lens", default="4,4,4,4,4,4,4,32",
                   help="comma-separated; request i wants gen_lens[i %% len] tokens")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--policy", default="reserve", help="allocation policy")
    p.add_argument("--batching", choices=("continuous", "static"), default="continuous")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        gen_lens = [int(x) for x in args.gen_lens.split(",")]
        if min(gen_lens) < 1:
            raise ValueError("every --gen-lens entry must be >= 1")
        if args.batching == "static":
            result = run_static(args.slots, args.prompt_len, gen_lens, args.requests)
        else:
            result = run_scheduled(args.slots, args.block_size, args.pool_tokens,
                                   args.prompt_len, gen_lens, args.requests, args.policy)
    except ValueError as e:
        print(f"nanoserve bench sched: error: {e}")
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bench sched ({result['batching']})")
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for k, v in result.items():
        table.add_row(k, str(v))
    Console().print(table)
    return 0
