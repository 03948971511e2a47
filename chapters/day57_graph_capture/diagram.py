"""Day 57's figure: the capture list, a padded step over the static buffers, and which windows
the worst shape used.

    python chapters/day57_graph_capture/diagram.py

writes build/figures/day57_graph_capture/windows.png. Left: for 8 slots, each batch size and
the bucket it pads to (the pad rows hatched). Middle: the (5, 4) copy-in the frozen snapshot
builds for rows (2, 0, 1) padded to the bucket-4 window, one cell per value, the pad row's
cells marked. Right: the worst shape of Day 58's table (8 slots, 16 requests, generation
lengths 4/8/16/32) run through nanoserve-tiny with windows in eager replay, the replayed
decode steps counted by bucket, free rows beside the persistent batch.
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
    from chapters.common import SHIPPED
    from nanoserve import LLM, SamplingParams

    gen = (4, 8, 16, 32)
    width = 0.38
    for j, compact in enumerate((False, True)):
        llm = LLM(SHIPPED, dtype="float32", max_num_seqs=SLOTS, max_model_len=64,
                  skip_tokenizer_init=True, cuda_graphs=True, compact_rows=compact)
        llm.generate([[0, 5 + i, 9, 11] for i in range(16)],
                     [SamplingParams(temperature=0, max_tokens=gen[i % 4], ignore_eos=True)
                      for i in range(16)])
        by = llm.engine.graphs.by_bucket
        xs = [k + (j - 0.5) * width for k in range(len(by))]
        color = COLORS["compute"] if compact else COLORS["reference"]
        ax.bar(xs, list(by.values()), width=width * 0.95, color=color)
        for x, n in zip(xs, by.values(), strict=True):
            ax.text(x, n + 0.5, str(n), ha="center", fontsize=8.5)
        s = llm.stats
        ax.text(0.02, 0.95 - 0.08 * j, f"{'persistent' if compact else 'free rows'}: "
                f"{s.decode_steps_replayed} of {s.decode_steps} replayed, "
                f"{llm.engine.graphs.padded_rows} pad rows", transform=ax.transAxes,
                fontsize=8.5, color=color)
    ax.set_xticks(range(4), [f"window {b}" for b in capture_sizes(SLOTS)])
    ax.set_ylim(0, 36)
    ax.set_ylabel("decode steps replayed")
    ax.set_title("Worst shape, by window (2-core CPU)", loc="left", fontsize=11)


if __name__ == "__main__":
    fig, (a, b, c) = figure(width=14, height=4.4, ncols=3,
                            gridspec_kw={"width_ratios": [1, 1.15, 1.1]})
    buckets(a)
    copy_in(b)
    used(c)
    save(fig, __file__, "windows")
