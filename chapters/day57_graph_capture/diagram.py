"""Day 57's figure: the capture list, a padded step over the static buffers, and which windows
the worst shape used.

    python chapters/day57_graph_capture/diagram.py

writes build/figures/day57_graph_capture/windows.png. Left: for 8 slots, each batch size and
the bucket it pads to (the pad rows hatched). Middle: the (5, 4) copy-in the frozen snapshot
builds for rows (2, 0, 1) padded to the bucket-4 window, one cell per value, the pad row's
cells marked. Right: the chapter's worst shape (8 slots, 16 requests, generation lengths
4/8/16/32) run through nanoserve-tiny with windows in eager replay over free rows: the decode
steps each window replayed, beside the scattered steps that ran the eager forward.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day57_graph_capture.snapshot.windows import (  # noqa: E402
    bucket_for,
    capture_sizes,
    host_inputs,
)
from diagrams import COLORS, figure, save  # noqa: E402

SLOTS = 8


def buckets(ax) -> None:
    sizes = capture_sizes(SLOTS)
    for n in range(1, SLOTS + 1):
        b = bucket_for(n, sizes)
        ax.barh(n, n, color=COLORS["compute"], height=0.7)
        if b > n:
            ax.barh(n, b - n, left=n, color=COLORS["paper"], edgecolor=COLORS["waste"],
                    hatch="///", height=0.7)
        ax.text(b + 0.15, n, f"window {b}", va="center", fontsize=8.5)
    ax.set_yticks(range(1, SLOTS + 1))
    ax.set_ylabel("rows in the step")
    ax.set_xlabel("rows the window computes")
    ax.set_xlim(0, SLOTS + 2.6)
    ax.invert_yaxis()
    ax.set_title(f"Capture list {sizes}", loc="left", fontsize=11)
    ax.legend(handles=[Patch(color=COLORS["compute"], label="real rows"),
                       Patch(facecolor=COLORS["paper"], edgecolor=COLORS["waste"],
                             hatch="///", label="pad rows")], loc="upper right", fontsize=8)


def copy_in(ax) -> None:
    lengths, cells = {0: 3, 1: 6, 2: 2}, {0: 3, 1: 14, 2: 22}  # the notebook's engine
    table = host_inputs([2, 0, 1], [4, 6, 12], lengths, cells, 4)
    names = ["ids", "positions", "write cells", "src rows", "context lens"]
    for k, row in enumerate(table):
        for i, value in enumerate(row):
            pad = i == 3
            ax.add_patch(Rectangle((i, 4 - k), 0.92, 0.85, facecolor=COLORS["muted"] if pad
                                   else COLORS["memory"], edgecolor=COLORS["ink"],
                                   linewidth=0.6))
            ax.text(i + 0.46, 4 - k + 0.42, str(value), ha="center", va="center", fontsize=9,
                    color=COLORS["ink"] if pad else COLORS["paper"])
        ax.text(-0.15, 4 - k + 0.42, names[k], ha="right", va="center", fontsize=8.5)
    for i in range(4):
        ax.text(i + 0.46, 5.05, "pad" if i == 3 else f"row {i}", ha="center",
                fontsize=8)
    ax.set_xlim(-2.4, 4.1)
    ax.set_ylim(-0.6, 5.5)
    ax.axis("off")
    ax.text(1.8, -0.4, "pad row: context 0 (reads nothing); rewrites row 0's cell", ha="center",
            fontsize=8, color=COLORS["waste"])
    ax.set_title("Copy-in for rows (2, 0, 1), window 4", loc="left", fontsize=11)


def used(ax) -> None:
    from chapters.day57_graph_capture.claims import worst

    w = worst(False)  # the claims' own run: windows over free rows
    by = w["by_bucket"]
    names = [str(b) for b in by] + ["none\n(eager)"]
    counts = [*by.values(), w["scattered"]]
    colors = [COLORS["compute"]] * len(by) + [COLORS["waste"]]
    ax.bar(range(len(counts)), counts, width=0.6, color=colors)
    for x, n in enumerate(counts):
        ax.text(x, n + 0.6, str(n), ha="center", fontsize=8.5)
    ax.text(0.02, 0.95, f"free rows: {w['replayed']} of {w['steps']} decode steps replayed, "
            f"{w['padded']} pad rows", transform=ax.transAxes, fontsize=8.5,
            color=COLORS["ink"])
    ax.set_xticks(range(len(counts)), names)
    ax.set_ylim(0, max(counts) * 1.25)
    ax.set_xlabel("window the step replayed")
    ax.set_ylabel("decode steps")
    ax.set_title("Worst shape, free rows (2-core CPU)", loc="left", fontsize=11)


if __name__ == "__main__":
    fig, (a, b, c) = figure(width=14, height=4.4, ncols=3,
                            gridspec_kw={"width_ratios": [1, 1.15, 1.1]})
    buckets(a)
    copy_in(b)
    used(c)
    save(fig, __file__, "windows")
