"""Day 29's numbers: what a static batch costs, in row-steps and in latency, on the log's shape."""

from __future__ import annotations

import functools

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED, best_of
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.runner import at_least, exact

from .snapshot.static_batch import StaticRun, run_static


@functools.cache
def _run() -> StaticRun:
    """After a warm-up, the least disturbed of three runs on one thread."""
    model = load_model(SHIPPED)
    run_static(model, DAY29_PROMPTS, DAY29_MAX_TOKENS, 4, 64, 8)  # warm-up
    best = best_of(3, {"static": lambda: run_static(model, DAY29_PROMPTS, DAY29_MAX_TOKENS, 4,
                                                    64, 8)},
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
    exact("forward passes (prefill + decode steps)", "32", lambda: _run().forward_passes),
    exact("row-steps issued", "256", lambda: _run().issued),
    exact("tokens wanted and handed back", "60", lambda: _run().useful),
    exact("share of issued row-steps spent on finished rows", "76.6%", lambda: _run().waste,
          fmt="{:.1%}".format),
    exact("iteration of a short request's last token", "4",
          lambda: _run().replies[0].finish_iteration),
    exact("iteration at which the static batch hands it back", "32",
          lambda: _run().replies[0].returned_iteration),
    exact("blocks reserved to run all eight at once (worst case each)", "31",
          lambda: _run().blocks_reserved),
    at_least("head-of-line latency inflation of a short request on this CPU (nanoserve-tiny)",
             "≥ 3x", 3.0, latency_inflation, fmt="{:.1f}x".format),
]
