"""Day 58's figures: the cache rows over time under both schedulers, and the coverage table.

    python chapters/day58_persistent_batch/diagram.py

writes three files into build/figures/day58_persistent_batch/:

- persistent-batch.png: the worst shape of the table (8 slots, 16 requests, generation lengths
  4/8/16/32) as eight cache rows over its iterations, one coloured bar per request in the row it
  holds; above each panel a strip marks every decode step replayed or scattered. Top: the
  free-row heap. Bottom: the persistent batch, with each move drawn as an arrow.
- coverage.png: the share of decode steps that could replay, per shape and scheduler, with the
  moves and cells the persistent batch paid written on its bars.
- windows.png: the worst shape through Day 57's windows on nanoserve-tiny (eager replay), the
  decode steps each window replayed under free rows and under the persistent batch, and the
  steps that replayed none.

The first two are counted by the frozen snapshot (Day 33's scheduler with this day's
compaction) over integer tokens, with no model loaded; the third reads Day 57's claims' runs of
the shipped model. Nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib import colormaps  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from chapters.day14_block_allocator.snapshot.block_allocator import (  # noqa: E402
    BlockAllocator,
)
from chapters.day33_preemption.snapshot.request import Request  # noqa: E402
from chapters.day58_persistent_batch.snapshot.compact import is_compact  # noqa: E402
from chapters.day58_persistent_batch.snapshot.coverage import (  # noqa: E402
    BLOCK_SIZE,
    COVERAGE_SHAPES,
    MODE_LABEL,
    Scheduler,
    coverage_table,
    run_coverage,
)
from diagrams import COLORS, figure, save  # noqa: E402

SLOTS, REQUESTS, GEN, PROMPT = 8, 16, (4, 8, 16, 32), 4  # the worst shape


def trace(mode: str) -> dict:
    """The harness's loop, recording who holds which row at each iteration, and the moves."""
    pool = BlockAllocator(SLOTS * -(-(PROMPT + max(GEN)) // BLOCK_SIZE), BLOCK_SIZE)
    sched = Scheduler(pool, SLOTS, allocation="incremental", compact_rows=mode == "persistent")
    for i in range(REQUESTS):
        sched.add(Request(i, [1] * PROMPT, max_tokens=GEN[i % len(GEN)]))
    cells: list[tuple[int, int, int, str]] = []  # (iteration, row, request, prefill|decode)
    steps: list[tuple[int, bool]] = []  # (iteration, replayed) for decode steps
    moves: list[tuple[int, int, int]] = []  # (iteration, src, dst)
    it = 0
    while True:
        out = sched.schedule()
        if out.num_scheduled == 0:
            break
        it += 1
        moves += [(it, m.src, m.dst) for m in out.moves]
        cells += [(it, r.slot, r.request_id, "prefill") for r in out.admitted]
        cells += [(it, r.slot, r.request_id, "decode") for r in out.decode]
        if out.decode:
            steps.append((it, is_compact(r.slot for r in out.decode)))
        for r in out.admitted + out.decode:
            r.append_token(1)
    counted = run_coverage(SLOTS, REQUESTS, list(GEN), PROMPT, mode)
    assert (len(steps), sum(ok for _, ok in steps), len(moves)) == \
        (counted["decode_steps"], counted["replayed"], counted["moves"])
    return {"iterations": it, "cells": cells, "steps": steps, "moves": moves,
            "replayed": counted["replayed"], "decode_steps": counted["decode_steps"],
            "cells_moved": counted["cells"]}


def lanes(ax, t: dict, title: str) -> None:
    palette = colormaps["tab20"]
    for it, row, rid, what in t["cells"]:
        ax.add_patch(Rectangle((it - 1, row + 0.12), 1.0, 0.76, facecolor=palette(rid % 20),
                               edgecolor="none", alpha=0.55 if what == "prefill" else 1.0))
    for it, ok in t["steps"]:  # the replay strip above the rows
        ax.add_patch(Rectangle((it - 1, SLOTS + 0.25), 1.0, 0.6, edgecolor="none",
                               facecolor=COLORS["compute"] if ok else COLORS["waste"]))
    for it, src, dst in t["moves"]:
        ax.add_patch(FancyArrowPatch((it - 0.5, src + 0.5), (it - 0.5, dst + 0.5),
                                     arrowstyle="-|>", mutation_scale=11, linewidth=1.4,
                                     color=COLORS["ink"], connectionstyle="arc3,rad=0.25"))
    ax.set_xlim(0, t["iterations"])
    ax.set_ylim(0, SLOTS + 1)
    ax.set_yticks([r + 0.5 for r in range(SLOTS)] + [SLOTS + 0.55],
                  [f"row {r}" for r in range(SLOTS)] + ["replay?"])
    ax.grid(False)
    ax.set_title(title, fontsize=10.5, loc="left")


def rows_figure(free: dict, persistent: dict) -> None:
    fig, axes = figure(width=12, height=8.2, nrows=2, sharex=True)
    lanes(axes[0], free, f"free-row heap: a request keeps its row; {free['replayed']} of "
                         f"{free['decode_steps']} decode steps are a prefix")
    lanes(axes[1], persistent,
          f"persistent batch: {len(persistent['moves'])} moves ({persistent['cells_moved']} "
          f"slot-table cells) keep the rows a prefix; {persistent['replayed']} of "
          f"{persistent['decode_steps']} replay")
    axes[1].set_xlabel("iteration (one schedule() and one model step)")
    fig.legend(handles=[
        Patch(color=COLORS["compute"], label="decode step: rows 0..n-1, a window can replay it"),
        Patch(color=COLORS["waste"], label="decode step: rows scattered, eager forward"),
        Patch(color=COLORS["reference"], alpha=0.55, label="paler: the request's prefill"),
    ], loc="lower center", ncols=3, fontsize=9, bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("Where the survivors sit: 8 slots, 16 requests of 4/8/16/32 tokens, one colour "
                 "per request", fontsize=12.5, fontweight="bold")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save(fig, __file__, "persistent-batch")


def coverage_figure() -> None:
    rows = coverage_table()
    n = len(COVERAGE_SHAPES)
    fig, ax = figure(width=12, height=4.8)
    width = 0.4
    for j, mode in enumerate(MODE_LABEL.values()):
        mine = [r for r in rows if r["batch"] == mode]
        for k, r in enumerate(mine):
            x = k + (j - 0.5) * width
            share = r["replayed"] / r["decode steps"]
            ax.bar(x, share, width=width * 0.95,
                   color=COLORS["reference"] if j == 0 else COLORS["compute"])
            ax.text(x, share + 0.02, r["share"], ha="center", va="bottom", fontsize=8.5)
            if j == 1 and r["moves"]:
                ax.text(x, share - 0.04, f"{r['moves']} mv\n{r['cells']} c", ha="center",
                        va="top", fontsize=7.5, color=COLORS["paper"])
    ax.set_xticks(range(n), [f"{s} slots\n{q} req\n{'/'.join(map(str, g))}"
                             for s, q, g in COVERAGE_SHAPES], fontsize=8.5)
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("decode steps a window could replay")
    ax.legend(handles=[Patch(color=COLORS["reference"], label="free rows"),
                       Patch(color=COLORS["compute"],
                             label="persistent (moves and cells on the bar)")],
              loc="upper right", ncols=2, fontsize=9)
    ax.set_title("Coverage by workload shape (host only; a bucket for every batch size)",
                 fontsize=11.5, loc="left")
    save(fig, __file__, "coverage")


def windows_figure() -> None:
    """Day 57's windows on the worst shape, free rows beside the persistent batch: the decode
    steps each window replayed, and the steps that replayed none. Read from Day 57's claims'
    own runs of nanoserve-tiny (eager replay on a CPU)."""
    from chapters.day57_graph_capture.claims import worst

    fig, ax = figure(width=7.5, height=4.2)
    width = 0.38
    for j, compact in enumerate((False, True)):
        w = worst(compact)
        counts = [*w["by_bucket"].values(), w["scattered"]]
        xs = [k + (j - 0.5) * width for k in range(len(counts))]
        color = COLORS["compute"] if compact else COLORS["reference"]
        ax.bar(xs, counts, width=width * 0.95, color=color)
        for x, n in zip(xs, counts, strict=True):
            ax.text(x, n + 0.5, str(n), ha="center", fontsize=8.5)
        ax.text(0.02, 0.95 - 0.08 * j, f"{'persistent' if compact else 'free rows'}: "
                f"{w['replayed']} of {w['steps']} replayed, {w['padded']} pad rows",
                transform=ax.transAxes, fontsize=8.5, color=color)
    buckets = list(worst(False)["by_bucket"])
    ax.set_xticks(range(len(buckets) + 1), [*map(str, buckets), "none\n(eager)"])
    ax.set_xlabel("window the step replayed")
    ax.set_ylabel("decode steps")
    ax.set_ylim(0, 44)
    ax.set_title("Worst shape through Day 57's windows (2-core CPU, eager replay)", loc="left",
                 fontsize=11)
    save(fig, __file__, "windows")


if __name__ == "__main__":
    rows_figure(trace("free"), trace("persistent"))
    coverage_figure()
    windows_figure()
