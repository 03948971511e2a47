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


def held_row_steps() -> int:
    """Row-steps issued for rows whose request had already finished: issued minus handed back,
    both counted on the run."""
    return row_steps() - sum(len(r.token_ids) for r in counted()[0].replies)


def three_counts() -> str:
    """The same run under three conventions, each from the forwards the hook counted: ours (the
    prefill yields every row's first token); one pass more per row (a prefill that yields
    nothing); decode steps only (the prefill left out of both sides)."""
    fwd, rows = counted()[1].calls, len(DAY29_PROMPTS)
    useful = sum(len(r.token_ids) for r in counted()[0].replies)
    held = held_row_steps()
    ours, extra, decode = row_steps(), (fwd + 1) * rows, (fwd - 1) * rows
    return (f"{ours} issued ({1 - useful / ours:.1%}), {extra} issued "
            f"({1 - useful / extra:.1%}), {decode} decode-only ({held / decode:.1%})")


def grants() -> str:
    """Blocks each request is granted up front (its prompt plus max_tokens), by the allocator's
    own sizing: the seven short requests together, then the long one."""
    from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator

    pool = BlockAllocator(SHAPE["num_blocks"], SHAPE["block_size"])
    each = [pool.blocks_for_length(len(p) + m)
            for p, m in zip(DAY29_PROMPTS, DAY29_MAX_TOKENS, strict=True)]
    return f"{sum(each[:7])} + {each[7]}"


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
    exact("row-steps issued for rows that had already finished", held_row_steps),
    exact("the same run counted three ways: issued row-steps (share on finished rows)",
          three_counts),
    exact("blocks granted: the seven short requests together + the long one", grants),
    timed("head-of-line latency inflation of a short request on this CPU (nanoserve-tiny)",
          latency_inflation, fmt="{:.1f}x".format),
]
