"""Day 29's figures: the static batch as an iteration timeline, and three ways to count it.

    python chapters/day29_static_batch/diagram.py

writes build/figures/day29_static_batch/timeline.png and counting.png. The shape is the log's
(chapters/common.py: eight requests, seven want 4 tokens, one wants 32) under the snapshot's
conventions: an iteration is one forward, the prefill is iteration 1 and yields every row's first
token. Nothing is measured, so no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.common import DAY29_MAX_TOKENS  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

ITERS = max(DAY29_MAX_TOKENS)  # the wave runs until its longest member is done
ROWS = len(DAY29_MAX_TOKENS)


def timeline() -> None:
    fig, ax = figure(width=11, height=5.2)
    for r, m in enumerate(DAY29_MAX_TOKENS):
        y = ROWS - 1 - r
        for it in range(1, ITERS + 1):
            x = it - 1
            if it <= m:
                face = COLORS["highlight"] if it == 1 else COLORS["compute"]
                ax.add_patch(Rectangle((x, y), 0.9, 0.8, facecolor=face, edgecolor="none"))
            else:
                ax.add_patch(Rectangle((x, y), 0.9, 0.8, facecolor=COLORS["paper"],
                                       edgecolor=COLORS["waste"], hatch="////",
                                       linewidth=0.0))
        ax.text(-0.5, y + 0.4, f"r{r}: wants {m:2d}", ha="right", va="center", fontsize=10)
        # the hand-back: every row leaves when the wave ends
        ax.plot([ITERS + 0.2], [y + 0.4], marker="<", color=COLORS["ink"], markersize=7)
        if m < ITERS:
            ax.plot([m - 0.05], [y + 0.4], marker="|", color=COLORS["ink"], markersize=16,
                    markeredgewidth=2.0)
    ax.text(ITERS + 0.8, ROWS - 0.6, "handed back\nafter iteration 32\n(all eight)",
            ha="left", va="top", fontsize=9.5)
    ax.annotate("r0-r6: own last token\nat iteration 4", xy=(3.95, ROWS - 0.05),
                xytext=(6.5, ROWS + 0.55), fontsize=9.5, ha="left", va="center",
                arrowprops={"arrowstyle": "-|>", "color": COLORS["ink"], "linewidth": 1.0})
    ax.text(15.5, 3.9, "held: computed every step, blocks still held,\nanswer complete "
            "but not handed back", ha="center", va="center", fontsize=10,
            color=COLORS["waste"], fontweight="bold",
            bbox={"facecolor": COLORS["paper"], "edgecolor": "none", "pad": 2.5})
    ax.set_xticks([i - 0.55 for i in (1, 4, 8, 12, 16, 20, 24, 28, 32)],
                  ["1", "4", "8", "12", "16", "20", "24", "28", "32"])
    ax.set_yticks([])
    ax.tick_params(length=0)
    ax.grid(False)
    for s in ("left", "bottom"):
        ax.spines[s].set_visible(False)
    ax.set_xlim(-4.2, ITERS + 6.5)
    ax.set_ylim(-0.35, ROWS + 1.1)
    ax.set_xlabel("iteration (one forward pass of the whole wave)")
    held = sum(ITERS - m for m in DAY29_MAX_TOKENS)
    issued = ROWS * ITERS
    useful = sum(DAY29_MAX_TOKENS)
    ax.legend(handles=[
        Patch(color=COLORS["highlight"], label=f"prefill: iteration 1, every row's 1st token "
              f"({ROWS} row-steps)"),
        Patch(color=COLORS["compute"], label=f"decode step for a wanted token "
              f"({useful - ROWS} row-steps)"),
        Patch(facecolor=COLORS["paper"], edgecolor=COLORS["waste"], hatch="////",
              label=f"held row ({held} row-steps)")],
        loc="upper center", bbox_to_anchor=(0.47, -0.14), ncols=2, fontsize=9.5)
    ax.set_title(f"A static batch on the Day-29 shape: {issued} row-steps issued for "
                 f"{useful} tokens ({held / issued:.1%} on finished rows)", fontsize=12.5)
    save(fig, __file__, "timeline")


def counting() -> None:
    """The same run, three ways of deciding what 'issued' is."""
    useful = sum(DAY29_MAX_TOKENS)
    rows = [
        ("this book: every forward,\nprefill yields token 1", ROWS * ITERS, useful),
        ("the log's Day 30 entry:\none more pass per row (8 x 33)", ROWS * (ITERS + 1), useful),
        ("decode steps only\n(prefill left out on both sides)", ROWS * (ITERS - 1),
         useful - ROWS),
    ]
    fig, ax = figure(width=10, height=3.6)
    for i, (_label, issued, good) in enumerate(rows):
        y = len(rows) - 1 - i
        ax.barh(y, good, color=COLORS["compute"], height=0.55)
        ax.barh(y, issued - good, left=good, color=COLORS["waste"], alpha=0.8, height=0.55)
        ax.text(good / 2, y, f"{good}", ha="center", va="center", color="white", fontsize=10)
        ax.text(good + (issued - good) / 2, y, f"{issued - good}", ha="center", va="center",
                color="white", fontsize=10)
        ax.text(issued + 4, y, f"{issued} issued: {1 - good / issued:.1%} not useful",
                ha="left", va="center", fontsize=10.5,
                fontweight="bold" if i == 0 else "normal")
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=10)
    ax.set_xlim(0, 400)
    ax.set_xlabel("row-steps")
    ax.grid(axis="y", visible=False)
    ax.legend(handles=[Patch(color=COLORS["compute"], label="useful (a token handed back)"),
                       Patch(color=COLORS["waste"], alpha=0.8, label="not useful")],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, fontsize=9.5)
    ax.set_title("One run, three counts: the percentage depends on what is called a step",
                 fontsize=12.5)
    save(fig, __file__, "counting")


if __name__ == "__main__":
    timeline()
    counting()
