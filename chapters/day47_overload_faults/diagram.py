"""Day 47's figure: a burst at the door, and one engine step that raises.

    python chapters/day47_overload_faults/diagram.py

writes build/figures/day47_overload_faults/overload-and-faults.png. Left: 16 arrivals within
one engine iteration, every slot busy, max_waiting 4, through the frozen ``Door`` counted both
ways: the requests really waiting after each arrival, and which arrivals were refused. Right:
a faulted step drawn as a timeline: the claims' four running requests (two streamed), the step
that raises, the four ending with "error" and their blocks going back; two waiting requests are
added to show what a fault leaves alone (the claims' run has none waiting). Nothing is measured
or timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Rectangle  # noqa: E402

from chapters.day47_overload_faults.snapshot.admission import Door  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

BURST, LIMIT = 16, 4


def trace(count_inbox: bool) -> tuple[list[int], list[bool]]:
    door = Door(LIMIT, count_inbox)
    waiting, admitted = [], []
    for _ in range(BURST):
        admitted.append(door.arrive())
        waiting.append(door.inbox + door.queue)
    return waiting, admitted


def main() -> None:
    fig, (ax, bx) = figure(width=13, height=5.2, ncols=2)
    xs = list(range(1, BURST + 1))
    for count_inbox, color, label in ((False, "waste", "counting the scheduler's queue only"),
                                      (True, "memory", "counting inbox + queue (nanoserve)")):
        waiting, admitted = trace(count_inbox)
        ax.step(xs, waiting, where="post", color=COLORS[color], linewidth=2.2, label=label)
        refused = [x for x, ok in zip(xs, admitted, strict=True) if not ok]
        if refused:
            ax.scatter(refused, [LIMIT] * len(refused), marker="x", color=COLORS[color],
                       zorder=3, label="refused: 429, Retry-After: 1")
    ax.axhline(LIMIT, color=COLORS["reference"], linestyle="--", linewidth=1)
    ax.text(1, LIMIT + 0.3, "max_waiting = 4", color=COLORS["reference"], fontsize=9)
    ax.set_xlabel("arrival (16 within one engine iteration, every slot busy)")
    ax.set_ylabel("requests really waiting")
    ax.set_title("the frozen door: 4 admitted, 12 refused")
    ax.set_xticks(xs)
    ax.legend(fontsize=8.5, loc="upper left", bbox_to_anchor=(0.0, 0.93))

    # right: one step raises
    steps, fault = 8, 4
    bx.set_xlim(0, steps + 0.5)
    bx.set_ylim(-0.6, 6.7)
    bx.set_yticks(range(6))
    bx.set_yticklabels(["waiting 2", "waiting 1", "plain 2", "plain 1", "stream 2",
                        "stream 1"])
    bx.set_xticks([s + 0.5 for s in range(steps)])
    bx.set_xticklabels([f"k{'' if s == fault else f'{s - fault:+d}'}" for s in range(steps)])
    bx.set_xlabel("engine step\nplain: 500 in the error shape; stream: an error event, then "
                  "data: [DONE]", fontsize=9.5)
    bx.grid(visible=False)
    for row in range(2, 6):
        for s in range(steps):
            if s < fault:
                color = "compute"
            elif s == fault:
                color = "waste"
            else:
                continue
            bx.add_patch(Rectangle((s + 0.05, row - 0.35), 0.9, 0.7,
                                   facecolor=COLORS[color], edgecolor="none"))
        bx.text(fault + 1.1, row, "error, blocks back", va="center", fontsize=8.5,
                color=COLORS["waste"])
    for row in range(2):
        for s in range(steps):
            color = "muted" if s <= fault else "compute"
            bx.add_patch(Rectangle((s + 0.05, row - 0.35), 0.9, 0.7,
                                   facecolor=COLORS[color], edgecolor="none"))
    bx.text(fault + 0.5, 6.25, "InjectedFault", ha="center", fontsize=9, color=COLORS["waste"],
            fontweight="bold")
    bx.set_title("a step that raises fails only its own requests")
    bx.text(steps + 0.45, 0.5, "(illustration)", rotation=90, va="center", ha="right",
            fontsize=8, color=COLORS["reference"])
    fig.suptitle("Day 47: overload and faults (nanoserve-tiny, float32, 4 slots, "
                 "2-core CPU server)", fontsize=12, fontweight="bold")
    save(fig, __file__, "overload-and-faults")


if __name__ == "__main__":
    main()
