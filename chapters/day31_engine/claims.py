"""Day 31's numbers: Day 29's measurement rerun on the scheduled loop, same model, same machine,
same harness conventions."""

from __future__ import annotations

import functools

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED, best_of
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day29_static_batch.snapshot.static_batch import StaticRun, run_static
from chapters.runner import at_least, at_most, exact

from .snapshot.scheduled import run_scheduled

SHAPE = dict(block_size=4, num_blocks=64, max_num_seqs=8)


def _wall(run: StaticRun) -> float:
    return max(r.returned_time for r in run.replies) - run.replies[0].start_time


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


def same_tokens() -> int:
    static, scheduled = runs()
    return sum(a.token_ids == b.token_ids for a, b in zip(static.replies, scheduled.replies,
                                                             strict=True))


CLAIMS = [
    exact("requests whose tokens are identical, static vs scheduled", "8 of 8", same_tokens,
          fmt="{} of 8".format),
    exact("row-steps issued: static, then scheduled", "256, then 60",
          lambda: f"{runs()[0].issued}, then {runs()[1].issued}"),
    exact("share of row-steps on finished rows, scheduled", "0.0%", lambda: runs()[1].waste,
          fmt="{:.1%}".format),
    exact("iteration after which r0 is handed back: static, then scheduled", "32, then 4",
          lambda: f"{runs()[0].replies[0].returned_iteration}, then "
                  f"{runs()[1].replies[0].returned_iteration}"),
    at_most("head-of-line inflation of a short request, scheduled (nanoserve-tiny, this CPU)",
            "≤ 1.5x", 1.5, lambda: inflation(runs()[1]), fmt="{:.2f}x".format),
    at_least("the same inflation, static batch, measured in the same run", "≥ 3x", 3.0,
             lambda: inflation(runs()[0]), fmt="{:.1f}x".format),
    at_least("wall-clock for the whole shape, static / scheduled (same run)", "≥ 1.1x", 1.1,
             lambda: _wall(runs()[0]) / _wall(runs()[1]),
             fmt="{:.2f}x".format),
]
