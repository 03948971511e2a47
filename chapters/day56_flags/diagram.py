"""Day 56's figure: four flags, one place they are bundled, four keywords below it.

    python chapters/day56_flags/diagram.py

writes build/figures/day56_flags/flags.png. Left: the speed flags of ``nanoserve serve`` going
through ``EngineConfig`` (whose ``persistent_batch`` is the one rule) into ``LLM`` and
``AsyncLLM``, then splitting by owner (the engine computes a step; the engine core's scheduler
decides rows). Right: the tri-state ``--persistent-batch`` resolved by the frozen rule for each
state of ``--cuda-graphs``. Nothing is timed and no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch  # noqa: E402

from chapters.day56_flags.snapshot.flags import resolve  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

FLAGS = ["--compile / --no-compile", "--attention", "--cuda-graphs /\n--no-cuda-graphs",
         "--persistent-batch /\n--no-persistent-batch"]
KEYWORDS = ["compile", "attention", "cuda_graphs", "compact_rows"]


def arrow(ax, a, b, color="ink", style="-|>"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, linewidth=1.1,
                                 color=COLORS[color]))


def wiring(ax) -> None:
    ax.set_xlim(0, 10.4)
    ax.set_ylim(-0.6, 5.2)
    ax.axis("off")
    ys = [4.2, 3.1, 2.0, 0.9]
    for y, flag in zip(ys, FLAGS, strict=True):
        box(ax, 0.0, y - 0.38, 2.3, 0.76, flag, "muted", fontsize=8, text_color=COLORS["ink"])
        arrow(ax, (2.3, y), (3.2, 2.55))
    box(ax, 3.2, 1.7, 1.9, 1.7, "EngineConfig\n\nunset persistent\nbatch follows\n"
        "--cuda-graphs", "highlight", fontsize=8.5, text_color=COLORS["ink"])
    box(ax, 5.8, 1.95, 1.7, 1.2, "LLM\nAsyncLLM\n(4 fields)", "compute", fontsize=8.5)
    arrow(ax, (5.1, 2.55), (5.8, 2.55))
    box(ax, 8.2, 3.3, 2.1, 1.2, "Engine\ncompile, attention,\ncuda_graphs", "compute",
        fontsize=8)
    box(ax, 8.2, 0.6, 2.1, 1.2, "Scheduler\n(in the core)\ncompact_rows", "memory", fontsize=8)
    arrow(ax, (7.5, 2.8), (8.2, 3.9))
    arrow(ax, (7.5, 2.3), (8.2, 1.2))
    ax.text(5.2, -0.4, "the only bundling: one rule, EngineConfig.persistent_batch", ha="center",
            fontsize=9, color=COLORS["ink"])
    ax.set_title("Each speed option is its own switch", loc="left", fontsize=11.5)


def table(ax) -> None:
    ax.axis("off")
    states = [(None, "unset"), (True, "--persistent-batch"), (False, "--no-persistent-batch")]
    ax.set_xlim(0, 4.2)
    ax.set_ylim(0, 4.3)
    ax.text(2.8, 3.9, "graphs\noff", ha="center", fontsize=8, weight="bold")
    ax.text(3.7, 3.9, "graphs\non", ha="center", fontsize=8, weight="bold")
    for i, (pb, name) in enumerate(states):
        y = 3.0 - i * 1.05
        ax.text(0.0, y, name, va="center", fontsize=8, family="monospace")
        for j, graphs in enumerate((False, True)):
            on = resolve(graphs, pb)
            x = 2.45 + j * 0.9
            box(ax, x, y - 0.35, 0.7, 0.7, "on" if on else "off",
                "memory" if on else "reference", fontsize=9)
    ax.set_title("compact_rows", loc="left", fontsize=11.5)


if __name__ == "__main__":
    fig, (left, right) = figure(width=12, height=4.4, ncols=2,
                                gridspec_kw={"width_ratios": [2.3, 1]})
    wiring(left)
    table(right)
    save(fig, __file__, "flags")
