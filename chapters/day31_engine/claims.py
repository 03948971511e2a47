"""Day 31's numbers: Day 29's measurement rerun on the scheduled loop, same model, same machine,
same harness conventions."""

from __future__ import annotations

import functools

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED, best_of
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day29_static_batch.snapshot.static_batch import StaticRun, run_static
from chapters.runner import exact, timed

from .snapshot.scheduled import run_scheduled

SHAPE = dict(block_size=4, num_blocks=64, max_num_seqs=8)


def _wall(run: StaticRun) -> float:
    return max(r.returned_time for r in run.replies) - run.replies[0].start_time


@functools.cache
def counted() -> tuple[StaticRun, StaticRun]:
    """(static, scheduled), one untimed run each: what they compute does not depend on the
    clock."""
    model = load_model(SHIPPED)
    args = (model, DAY29_PROMPTS, DAY29_MAX_TOKENS)
    return run_static(*args, **SHAPE), run_scheduled(*args, **SHAPE)


@functools.cache
def runs() -> tuple[StaticRun, StaticRun]:
    """(static, scheduled): three interleaved rounds on one thread, after a warm-up; each
    policy keeps its least disturbed run."""
    model = load_model(SHIPPED)
    args = (model, DAY29_PROMPTS, DAY29_MAX_TOKENS)
    run_static(*args, **SHAPE)
    run_scheduled(*args, **SHAPE)
    best = best_of(3, {"static": lambda: run_static(*args, **SHAPE),
                       "scheduled": lambda: run_scheduled(*args, **SHAPE)}, _wall)
    return best["static"], best["scheduled"]


def inflation(run: StaticRun) -> float:
    """Median over the seven short requests: time until handed back / until own last token."""
    short = sorted((r.returned_time - r.start_time) / (r.last_token_time - r.start_time)
                   for r in run.replies if len(r.token_ids) == 4)
    return short[len(short) // 2]


@functools.cache
def one_row_share(steps: int = 16, rounds: int = 3) -> float:
    """What a one-row decode step costs against an eight-row one on this machine (Day 28's
    frozen step, nanoserve-tiny, one thread, interleaved rounds): the condition of the
    wall-clock row, which can only show saved rows if a step's cost falls with its rows."""
    import time

    import torch

    from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
    from chapters.day28_batched_decode.claims import _setup
    from chapters.day28_batched_decode.snapshot.decode import batched_decode

    model = load_model(SHIPPED)

    def arm(rows_n: int):
        @torch.inference_mode()
        def once() -> float:
            cache, rows, prompts = _setup(model, [16] * rows_n, steps)
            padded_prefill(model, cache, rows, prompts)
            t0 = time.perf_counter()
            for _ in range(steps):
                batched_decode(model, cache, rows, [1] * rows_n)
            return time.perf_counter() - t0
        return once

    best = best_of(rounds, {"one": arm(1), "eight": arm(8)}, lambda seconds: seconds)
    return best["one"] / best["eight"]


def rows_cost_time() -> str | None:
    """The wall-clock row's condition: a one-row step costs clearly less than an eight-row one.
    Where it costs nearly as much (a step that is all fixed overhead), the 28 one-row steps the
    scheduler leaves take as long as eight-row ones would, and no bound above 1x can hold."""
    share = one_row_share()
    if share <= 0.85:
        return None
    return (f"needs a one-row decode step at most 85% of an eight-row one; here it costs "
            f"{share:.0%}")


def reserved_against_occupied() -> str:
    """The debt the day carries: the Day-29 shape after its first iteration, host-only over the
    frozen Day 30 scheduler (worst-case reservation): blocks reserved, then blocks the running
    requests' tokens occupy."""
    from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
    from chapters.day30_state_machine.snapshot.request import Request
    from chapters.day30_state_machine.snapshot.scheduler import Scheduler

    pool = BlockAllocator(SHAPE["num_blocks"], SHAPE["block_size"])
    sched = Scheduler(pool, SHAPE["max_num_seqs"])
    reqs = [Request(i, p, max_tokens=m) for i, (p, m) in enumerate(zip(DAY29_PROMPTS,
                                                                         DAY29_MAX_TOKENS,
                                                                         strict=True))]
    for r in reqs:
        sched.add(r)
    for r in sched.schedule().admitted:
        r.append_token(1)
    reserved = sum(len(r.blocks) for r in reqs)
    occupied = sum(pool.blocks_for_length(r.num_tokens) for r in reqs)
    return f"{reserved} reserved, {occupied} occupied"


def same_tokens() -> int:
    static, scheduled = counted()
    return sum(a.token_ids == b.token_ids for a, b in zip(static.replies, scheduled.replies,
                                                             strict=True))


CLAIMS = [
    exact("requests whose tokens are identical, static vs scheduled", same_tokens,
          fmt="{} of 8".format),
    exact("row-steps issued: static, then scheduled",
          lambda: f"{counted()[0].issued}, then {counted()[1].issued}"),
    exact("share of row-steps on finished rows, scheduled", lambda: counted()[1].waste,
          fmt="{:.1%}".format),
    exact("iteration after which r0 is handed back: static, then scheduled",
          lambda: f"{counted()[0].replies[0].returned_iteration}, then "
                  f"{counted()[1].replies[0].returned_iteration}"),
    timed("head-of-line inflation of a short request, scheduled",
          lambda: inflation(runs()[1]), fmt="{:.2f}x".format),
    timed("the same inflation, static batch, same run", lambda: inflation(runs()[0]),
          fmt="{:.1f}x".format),
    timed("wall clock for the whole shape, static / scheduled, same run, on a CPU where a "
          "one-row decode step costs at most 85% of an eight-row one",
          lambda: _wall(runs()[0]) / _wall(runs()[1]), fmt="{:.2f}x".format,
          needs=rows_cost_time),
    exact("Day-29 shape after its first iteration: blocks reserved, blocks its tokens occupy",
          reserved_against_occupied),
]
