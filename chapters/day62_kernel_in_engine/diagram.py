"""Day 62's figure: where each step's attention goes with attention="triton", and why prefill
stays where it was.

    python chapters/day62_kernel_in_engine/diagram.py

writes build/figures/day62_kernel_in_engine/engine-paths.png. Left: a step's route in the
engine (the frozen snapshot's ``route``): decode steps to the kernel with block ids taken from
the slot table, prompts to packed prefill over their fresh K/V. Right: pool cells read per KV
head and layer to prefill one prompt of n tokens, through the kernel (each query token re-reads
its causal prefix, ``prefix_cells_read``) against packed prefill (none), with the cells one
decode step of that row reads for scale. Arithmetic only; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch  # noqa: E402

from chapters.day62_kernel_in_engine.snapshot.engine_read import (  # noqa: E402
    prefix_cells_read,
    route,
)
from diagrams import COLORS, box, figure, save  # noqa: E402


def arrow(ax, a, b):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, linewidth=1.3,
                                 color=COLORS["ink"]))


def routes_panel(ax) -> None:
    steps = [("prompts, every row from position 0", [7, 12, 5], [0, 0, 0]),
             ("decode: one new token per row", [1, 1, 1], [9, 40, 17]),
             ("a prompt after cached tokens", [6], [20])]
    colors = {"packed prefill": "memory", "kernel": "compute", "reference": "reference"}
    notes = {"packed prefill": "attends over the fresh K/V;\nno pool read",
             "kernel": "block ids = slot-table cells\nat each block's start // bs",
             "reference": "resumes a cached context:\n0 calls in the claims' run"}
    for i, (label, new, starts) in enumerate(steps):
        y = 2.2 - i * 1.1
        path = route(new, starts)
        box(ax, 0.0, y, 3.3, 0.7, f"{label}\nnew {new}, starts {starts}", "muted", 8.5,
            COLORS["ink"])
        arrow(ax, (3.35, y + 0.35), (4.05, y + 0.35))
        box(ax, 4.1, y, 2.0, 0.7, path, colors[path], 10)
        ax.text(6.25, y + 0.35, notes[path], va="center", fontsize=8)
    ax.set_xlim(-0.1, 8.6)
    ax.set_ylim(-0.1, 3.1)
    ax.axis("off")
    ax.set_title('attention="triton": where a step\'s attention goes', fontsize=11, loc="left")


def reads_panel(ax) -> None:
    ns = list(range(16, 2049, 16))
    ax.plot(ns, [prefix_cells_read(n) for n in ns], color=COLORS["waste"], linewidth=2,
            label="prompt through the kernel: n(n+1)/2")
    ax.plot(ns, [0] * len(ns), color=COLORS["memory"], linewidth=2,
            label="packed prefill: 0 (fresh K/V)")
    ax.plot(ns, ns, color=COLORS["compute"], linewidth=1.5, linestyle="--",
            label="one decode step at context n: n")
    ax.annotate(f"512 tokens: {prefix_cells_read(512):,}", (512, prefix_cells_read(512)),
                xytext=(700, 1.2e6), fontsize=8.5, arrowprops=dict(arrowstyle="->"))
    ax.set_xlabel("prompt length n (tokens)")
    ax.set_ylabel("pool cells read, per KV head and layer")
    ax.legend(fontsize=8.5, loc="upper left")
    ax.set_title("Why prefill stays on packed prefill", fontsize=11, loc="left")


def main() -> None:
    fig, (left, right) = figure(width=13, height=4.6, ncols=2,
                                gridspec_kw={"width_ratios": [1.35, 1]})
    routes_panel(left)
    reads_panel(right)
    fig.suptitle("The kernel in the engine: decode through block ids, prompts as before",
                 fontsize=12.5, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "engine-paths")


if __name__ == "__main__":
    main()
