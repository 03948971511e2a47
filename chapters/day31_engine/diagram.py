"""Day 31's figure: Day 29's static batch against the scheduled engine, on the same shape.

    python chapters/day31_engine/diagram.py

writes build/figures/day31_engine/static-vs-scheduled.png. The counts come from the frozen Day 30
host-only harness (integer tokens, no model), which the chapter's claims show gives the same
row-steps and hand-back iterations as the real model on nanoserve-tiny. Nothing is timed here.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from chapters.common import DAY29_MAX_TOKENS  # noqa: E402
from chapters.day30_state_machine.snapshot.harness import (  # noqa: E402
    run_scheduled,
    run_static,
)
from diagrams import COLORS, figure, save  # noqa: E402


def rows_per_iteration(finish: list[int], iterations: int) -> np.ndarray:
    """Rows computed in each iteration when every request starts at iteration 1."""
    return np.array([sum(f >= i for f in finish) for i in range(1, iterations + 1)])


def main() -> None:
    static = run_static(slots=8, prompt_len=5, gen_lens=DAY29_MAX_TOKENS, requests=8)
    sched = run_scheduled(slots=8, block_size=4, pool_tokens=1024, prompt_len=5,
                          gen_lens=DAY29_MAX_TOKENS, requests=8)
    n = static["forward_passes"]
    it = np.arange(1, n + 1)
    live = rows_per_iteration(sched["finish_iteration"], n)   # rows still wanting a token
    static_rows = np.full(n, 8)

    fig, (left, right) = figure(width=12, height=4.8, ncols=2,
                                gridspec_kw={"width_ratios": [1.35, 1.0], "wspace": 0.28})

    # Left: rows computed per iteration. The area under each curve is the row-steps issued.
    left.bar(it, static_rows - live, bottom=live, width=1.0, color=COLORS["paper"],
             edgecolor=COLORS["waste"],
             hatch="////", linewidth=0.0, label=f"static: finished rows still computed "
             f"({static['issued_tokens'] - static['useful_tokens']} row-steps)")
    left.bar(it, live, width=1.0, color=COLORS["compute"], alpha=0.9,
             label=f"rows that still want a token ({sched['useful_tokens']} row-steps, "
             "all the scheduled loop computes)")
    left.step(np.r_[it - 0.5, n + 0.5], np.r_[static_rows, 8], where="post",
              color=COLORS["waste"], linewidth=1.6)
    left.text(18, 8.45, f"static batch: {static['issued_tokens']} row-steps issued",
              ha="center", va="bottom", fontsize=10, color=COLORS["waste"], fontweight="bold")
    left.annotate(f"scheduled: {sched['issued_tokens']} issued, "
                  f"{sched['useful_tokens']} useful", xy=(12, 1.05), xytext=(17, 3.1),
                  ha="center", fontsize=10, color=COLORS["compute"], fontweight="bold",
                  bbox={"facecolor": COLORS["paper"], "edgecolor": "none", "pad": 2.5},
                  arrowprops={"arrowstyle": "-|>", "color": COLORS["compute"]})
    left.set_xlim(0.4, n + 0.6)
    left.set_ylim(0, 10.8)
    left.set_yticks(range(0, 9, 2))
    left.set_xticks([1, 4, 8, 12, 16, 20, 24, 28, 32])
    left.set_xlabel("iteration")
    left.set_ylabel("rows computed in the forward")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=1, fontsize=9.5)
    left.set_title("Work: rows per forward pass", fontsize=11.5, loc="left")

    # Right: the iteration after which each request is handed back.
    x = np.arange(8)
    back_static = np.array(static["returned_iteration"])
    back_sched = np.array(sched["finish_iteration"])  # handed back by the next schedule()
    right.bar(x - 0.2, back_static, width=0.38, color=COLORS["reference"], label="static batch")
    right.bar(x + 0.2, back_sched, width=0.38, color=COLORS["compute"], label="scheduled")
    for i in x:
        right.text(i + 0.2, back_sched[i] + 0.6, str(back_sched[i]), ha="center",
                   va="bottom", fontsize=9)
    right.text(3.5, back_static[0] + 1.2, f"static: all eight after {back_static[0]}",
               ha="center", va="bottom", fontsize=9.5, color=COLORS["reference"])
    right.set_xticks(x, [f"r{i}\n({m})" for i, m in enumerate(DAY29_MAX_TOKENS)], fontsize=9.5)
    right.set_xlabel("request (tokens it wants)")
    right.set_ylabel("handed back after iteration")
    right.set_ylim(0, 38)
    right.grid(axis="x", visible=False)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncols=2, fontsize=9.5)
    right.set_title("Latency: when each answer comes back", fontsize=11.5, loc="left")

    fig.suptitle("Day 31: the Day-29 shape, static vs scheduled (8 requests, 5-token prompts, "
                 "8 slots, block_size 4)", fontsize=12.5, fontweight="bold")
    save(fig, __file__, "static-vs-scheduled")


if __name__ == "__main__":
    main()
