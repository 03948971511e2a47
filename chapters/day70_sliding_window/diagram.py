"""Day 70's figures: the blocks one long generation holds, and the table a window leaves behind.

    python chapters/day70_sliding_window/diagram.py

writes two PNGs under build/figures/day70_sliding_window/:

- ``blocks-held.png``: the claims' own generation (``claims.trace``: the bench's random 2-layer
  Mistral, window 64, blocks of 16, a 32-token prompt and 480 greedy tokens, reference backend),
  once with the blocks behind the window given back and once with every block kept: blocks held
  after each step, beside the bound ceil((w - 1) / bs) + 1;
- ``window-table.png``: the request's block table when its next query is at position 200, drawn
  from the frozen rule (``snapshot/window_blocks.py``): the entries behind the window name the
  null block, the window's keys fall in the last few entries.

Two generations of 480 tokens on a small model; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day70_sliding_window.claims import (  # noqa: E402
    BLOCK,
    PROMPT_LEN,
    WINDOW,
    trace,
)
from chapters.day70_sliding_window.snapshot import window_blocks as frozen  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

NEXT_POS = 200


def draw_held(ax) -> None:
    free, keep = trace("reference", True), trace("reference", False)
    pos = range(1, len(free["held"]) + 1)
    ax.plot(pos, keep["held"], color=COLORS["reference"], lw=2, label="every block kept")
    ax.plot(pos, free["held"], color=COLORS["memory"], lw=2,
            label="blocks behind the window given back")
    bound = frozen.most_visible(WINDOW, BLOCK)
    ax.axhline(bound, color=COLORS["highlight"], ls="--", lw=1.2)
    ax.text(pos[-1], bound + 0.6, f"ceil((w - 1) / bs) + 1 = {bound}", ha="right",
            fontsize=9, color=COLORS["ink"])
    ax.set_xlabel(f"engine step (the {PROMPT_LEN}-token prompt first, then one token a step)")
    ax.set_ylabel("blocks held after the step")
    same = "identical" if free["tokens"] == keep["tokens"] else "DIFFERENT"
    ax.set_title(f"One request, window {WINDOW}, blocks of {BLOCK}: text {same}",
                 fontsize=11, loc="left")
    ax.legend(loc="upper left", fontsize=9)


def draw_table(ax) -> None:
    n = NEXT_POS // BLOCK + 1
    table = [10 + 3 * i % 17 + i for i in range(n)]  # illustrative pool ids, none of them 0
    gone = frozen.out_of_window(NEXT_POS, WINDOW, BLOCK)
    seen = frozen.visible_blocks(NEXT_POS, WINDOW, BLOCK)
    entries, freed = frozen.give_back(table, gone, null=0)
    for i, b in enumerate(entries):
        color = COLORS["reference"] if i in gone else COLORS["memory"]
        box(ax, i, 1.0, 0.9, 0.9, str(b), color=color, fontsize=10)
        ax.text(i + 0.45, 0.8, str(i), ha="center", va="top", fontsize=8, color=COLORS["ink"])
    lo = max(0, NEXT_POS - WINDOW + 1)
    x0, x1 = lo / BLOCK, (NEXT_POS + 1) / BLOCK  # the window's keys, in table entries
    ax.annotate("", xy=(x0, 2.15), xytext=(x1, 2.15),
                arrowprops=dict(arrowstyle="<->", color=COLORS["highlight"], lw=2))
    ax.text((x0 + x1) / 2, 2.3, f"keys {lo}..{NEXT_POS}: entries {seen.start}-{seen.stop - 1}",
            ha="center", va="bottom", fontsize=9)
    ax.text(len(gone) / 2, 2.3, f"{len(freed)} blocks back in the pool;\ntheir entries name "
            f"block 0, the null block", ha="center", va="bottom", fontsize=9)
    ax.text(0, 0.2, "entry (position // block size)", fontsize=8, color=COLORS["ink"])
    ax.set_xlim(-0.3, n + 0.3)
    ax.set_ylim(0, 3.3)
    ax.axis("off")
    ax.set_title(f"The request's block table when its next query is at {NEXT_POS}",
                 fontsize=11, loc="left")


if __name__ == "__main__":
    fig, ax = figure(width=9, height=4)
    draw_held(ax)
    fig.tight_layout()
    save(fig, __file__, "blocks-held")
    fig, ax = figure(width=9, height=2.6)
    draw_table(ax)
    save(fig, __file__, "window-table")
