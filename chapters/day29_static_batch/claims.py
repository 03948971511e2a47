"""Day 29's numbers: what a static batch costs, in row-steps and in latency, on the log's shape."""

from __future__ import annotations

import functools

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED, ForwardCounter, best_of
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.runner import exact, timed

from .snapshot.static_batch import StaticRun, run_static

SHAPE = dict(block_size=4, num_blocks=64, max_num_seqs=8)


@functools.cache
def counted() -> tuple[StaticRun, ForwardCounter]:
    """One run, untimed, with a hook on the model's forward: the counts do not depend on the
    clock, so they come from a single run and the counter, not from the harness's own tally."""
    model = load_model(SHIPPED)
    with ForwardCounter(model) as fc:
        run = run_static(model, DAY29_PROMPTS, DAY29_MAX_TOKENS, **SHAPE)
    return run, fc


def row_steps() -> int:
    """Rows computed, summed over the forwards: the B of each (B, T) the model was given."""
    return sum(shape[0] for shape in counted()[1].shapes)


@functools.cache
def _run() -> StaticRun:
    """For the latency: after a warm-up, the least disturbed of three runs on one thread."""
    model = load_model(SHIPPED)
    run_static(model, DAY29_PROMPTS, DAY29_MAX_TOKENS, **SHAPE)  # warm-up
    best = best_of(3, {"static": lambda: run_static(model, DAY29_PROMPTS, DAY29_MAX_TOKENS,
                                                    **SHAPE)},
                   lambda run: run.replies[0].returned_time - run.replies[0].start_time)
    return best["static"]


def latency_inflation() -> float:
    """Short requests: time until the batch hands them back / time until their own last token,
    both from the start of the wave; the median of the seven."""
    short = [r for r in _run().replies if len(r.token_ids) == 4]
    ratios = sorted((r.returned_time - r.start_time) / (r.last_token_time - r.start_time)
                    for r in short)
    return ratios[len(ratios) // 2]


CLAIMS = [
    exact("forward passes (prefill + decode steps)", lambda: counted()[1].calls),
    exact("row-steps issued", row_steps),
    exact("tokens wanted and handed back",
          lambda: sum(len(r.token_ids) for r in counted()[0].replies)),
    exact("share of issued row-steps spent on finished rows (ratio)",
          lambda: 1 - sum(len(r.token_ids) for r in counted()[0].replies) / row_steps(),
          fmt="{:.1%}".format),
    exact("iteration of a short request's last token",
          lambda: counted()[0].replies[0].finish_iteration),
    exact("iteration at which the static batch hands it back",
          lambda: counted()[0].replies[0].returned_iteration),
    exact("blocks reserved to run all eight at once (worst case each)",
          lambda: counted()[0].blocks_reserved),
    timed("head-of-line latency inflation of a short request on this CPU (nanoserve-tiny)",
          latency_inflation, fmt="{:.1f}x".format),
]
