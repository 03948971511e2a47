"""Day 33's numbers: the log's table, exactly, and the cramped engine's text against the roomy's.

The table's rows come from the frozen harness. The events the prose narrates (who is evicted
at how many tokens, when one request buys its blocks, how many requests a pool runs at once)
come from ``trace``, the same loop over the same frozen scheduler with its preemptions and block
counts recorded as they happen; ``trace`` is held against the harness's counts, so the two
cannot describe different runs.
"""

from __future__ import annotations

import functools
from pathlib import Path

from chapters.common import SHIPPED
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.runner import exact

from .snapshot.harness import run_scheduled
from .snapshot.request import Request
from .snapshot.scheduler import Scheduler

README = Path(__file__).with_name("README.md")

POOLS = (48, 96, 128)


@functools.cache
def row(pool: int, policy: str) -> dict:
    """Four requests, 5-token prompts, 24 tokens each, 4 slots, block_size 4."""
    return run_scheduled(slots=4, block_size=4, pool_tokens=pool, prompt_len=5, gen_lens=[24],
                         requests=4, policy=policy)


def table_row(pool: int, policy: str) -> str:
    r = row(pool, policy)
    pre = "n/a" if policy == "reserve" else str(r["preemptions"])
    return f"{r['forward_passes']}, {r['occupancy']:.3f}, {pre}, {r['recomputed_tokens']}"


@functools.cache
def trace(pool: int, policy: str) -> dict:
    """The table's workload (four requests, 5-token prompts, 24 tokens each, 4 slots,
    block_size 4) through the frozen scheduler, recording what the harness only counts: each
    preemption as (request, its tokens then), every change of a request's block count as (its
    tokens then, blocks held), the most requests in one forward, and the iteration each
    request finished in."""
    events: dict = {"preempted": [], "blocks": {i: [] for i in range(4)}, "most_rows": 0,
                    "finished": [0] * 4}

    class Traced(Scheduler):
        def _preempt(self, victim):
            events["preempted"].append((victim.request_id, victim.num_tokens))
            super()._preempt(victim)

    sched = Traced(BlockAllocator(pool // 4, 4), 4, allocation=policy)
    reqs = [Request(i, [1] * 5, max_tokens=24) for i in range(4)]
    for r in reqs:
        sched.add(r)
    forwards = 0
    while rows := (out := sched.schedule()).admitted + out.decode:
        forwards += 1
        events["most_rows"] = max(events["most_rows"], len(rows))
        for r in rows:
            held = events["blocks"][r.request_id]
            if not held or held[-1][1] != len(r.blocks):
                held.append((r.num_tokens, len(r.blocks)))
            if r.append_token(1):
                events["finished"][r.request_id] = forwards
    if (forwards, sched.preemptions) != (row(pool, policy)["forward_passes"],
                                         row(pool, policy)["preemptions"]):
        raise AssertionError("the trace and the harness ran different schedules")
    events["worst_case_tokens"] = reqs[0].worst_case_tokens
    return events


def reservations() -> str:
    """Week 8: what one request books, then how many run at once and when each finishes."""
    t48, t96 = trace(48, "reserve"), trace(96, "reserve")
    booked = t96["blocks"][0][0][1]
    runs = "; ".join(f"pool {p}: {t['most_rows']} at once, finished at "
                     f"{', '.join(map(str, t['finished']))}"
                     for p, t in ((48, t48), (96, t96)))
    return f"{t96['worst_case_tokens']} tokens, {booked} blocks each; {runs}"


def purchases() -> str:
    """Day 33, request r0 of the 128-token pool: blocks at admission, then the token count at
    which each further block is bought."""
    held = trace(128, "incremental")["blocks"][0]
    return f"{held[0][1]} at admission; then at tokens {', '.join(str(n) for n, _ in held[1:])}"


def evictions(pool: int) -> str:
    return ", ".join(f"r{rid} at {n}" for rid, n in trace(pool, "incremental")["preempted"])


def fragmentation() -> str:
    return ", ".join(f"{row(p, 'incremental')['fragmentation_waste']:.1%}" for p in POOLS)


def prose_table_agrees() -> str:
    """The table under *Why it matters*, read back from the README and held against the
    harness cell by cell, so the copy in the prose cannot drift from the numbers table."""
    lines = README.read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| pool (tokens) | policy |"))
    agree = total = 0
    for ln in lines[head + 2:]:
        if not ln.startswith("|"):
            break
        pool, policy, *cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        measured = (either_row() if policy == "both"
                    else table_row(int(pool), policy)).split(", ")
        total += 1
        agree += cells == measured
    return f"{agree} of {total} rows agree"


def either_row() -> str:
    a, b = row(128, "reserve"), row(128, "incremental")
    same = all(a[k] == b[k] for k in ("forward_passes", "occupancy", "recomputed_tokens"))
    return table_row(128, "incremental") if same else "the policies differ"


def day29_blocks(policy: str) -> int:
    return run_scheduled(8, 4, 1024, 5, [4, 4, 4, 4, 4, 4, 4, 32], 8, policy)["peak_blocks_held"]


def cramped_equals_roomy() -> str:
    """nanoserve-tiny, 10 prompts, greedy: a 14-block pool against the default pool."""
    from nanoserve import LLM, SamplingParams

    kw = dict(dtype="float32", block_size=4, max_num_seqs=6)
    prompts = [[0, *range(3 + i, 8 + i + i % 4)] for i in range(10)]
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i, ignore_eos=True)
              for i in range(10)]
    roomy, cramped = LLM(SHIPPED, **kw), LLM(SHIPPED, num_kv_blocks=14, **kw)
    a = [o.token_ids for o in roomy.generate(prompts, params)]
    b = [o.token_ids for o in cramped.generate(prompts, params)]
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return f"{same} of 10 identical, {cramped.stats.preemptions} preemptions"


def day29_preemptions_in_16_blocks() -> str:
    n = run_scheduled(8, 4, 64, 5, [4] * 7 + [32], 8, "incremental")["preemptions"]
    return "no preemption" if n == 0 else f"{n} preemptions"


CLAIMS = [
    exact("pool 48, Week 8: iterations, occupancy, preemptions, tokens recomputed",
          lambda: table_row(48, "reserve")),
    exact("pool 48, Day 33", lambda: table_row(48, "incremental")),
    exact("pool 96, Week 8", lambda: table_row(96, "reserve")),
    exact("pool 96, Day 33", lambda: table_row(96, "incremental")),
    exact("pool 128, either policy", either_row),
    exact("rows per forward, pool 96: Week 8 vs Day 33",
          lambda: f"{row(96, 'reserve')['occupancy'] * 4:.1f} vs "
                  f"{row(96, 'incremental')['occupancy'] * 4:.1f}"),
    exact("Day-29 shape: blocks to run all eight at once, Week 8 vs Day 33",
          lambda: f"{day29_blocks('reserve')} against {day29_blocks('incremental')}"),
    exact("Day-29 shape in a 16-block pool under Day 33", day29_preemptions_in_16_blocks),
    exact("`reservation_waste` under Day 33 (pool 96)",
          lambda: row(96, "incremental")["reservation_waste"]),
    exact("cramped vs roomy engine on nanoserve-tiny", cramped_equals_roomy),
    exact("the table under *Why it matters*, read back against the harness", prose_table_agrees),
    exact("Week 8: one request's reservation; pools 48 and 96: most requests running at once, "
          "the iteration each finished in", reservations),
    exact("Day 33, one request (pool 128): blocks held at admission, and the tokens at which "
          "it buys the rest", purchases),
    exact("pool 48, Day 33: evictions in order (request at its token count)",
          lambda: evictions(48)),
    exact("pool 96, Day 33: the eviction", lambda: evictions(96)),
    exact("`fragmentation_waste` under Day 33, pools 48, 96, 128", fragmentation),
]
