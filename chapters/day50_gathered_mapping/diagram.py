"""Day 50's figures: the rectangle against the chunks, and what each read materialises.

    python chapters/day50_gathered_mapping/diagram.py

writes two files into build/figures/day50_gathered_mapping/:

- gathered-mapping.png: four rows with contexts 3, 70, 12 and 37 tokens. Top: Day 28's (B, S)
  rectangle, every row gathered at the longest row's width. Bottom: the chunk list the frozen
  ``GatheredIndex`` builds for the same rows at the engine's own chunk size, C = 32 (the
  numbers the chapter states for this batch), each chunk owned by one row, padding only at the
  end of a row's last chunk.
- workspace.png: one layer's read workspace from the frozen ``workspace_bytes`` for three
  batches at SmolLM2-135M's attention shape in bf16, reference against gathered.

Nothing is timed and no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day50_gathered_mapping.snapshot.attention import PATHS, workspace_bytes  # noqa: E402
from chapters.day50_gathered_mapping.snapshot.gathered import GatheredIndex  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

CONTEXTS, C = [3, 70, 12, 37], 32
ROW_COLORS = ["#2f6db5", "#3a9e6e", "#8e5ba8", "#e8a33d"]
BATCHES = [("one of 2000\n+ 31 of 50", [2000] + [50] * 31),
           ("32 of\n16..202", list(range(16, 208, 6))), ("32 of 512", [512] * 32)]


def cells(ax, x, y, n_real, width, color) -> None:
    for j in range(width):
        real = j < n_real
        ax.add_patch(Rectangle((x + j, y), 1, 0.8, facecolor=color if real else COLORS["waste"],
                               alpha=1.0 if real else 0.35, edgecolor="white", linewidth=0.3))


def mapping(ax) -> None:
    S = max(CONTEXTS)
    index = GatheredIndex(len(CONTEXTS), chunk=C)
    slots = torch.arange(len(CONTEXTS) * S).view(len(CONTEXTS), S)
    _, chunk_b = index.update(list(range(len(CONTEXTS))), CONTEXTS,
                              slots[torch.arange(len(CONTEXTS)), torch.tensor(CONTEXTS) - 1],
                              slots)
    top = len(CONTEXTS) + len(chunk_b) + 3
    for b, n in enumerate(CONTEXTS):  # the rectangle, one line per row
        y = top - 1 - b
        cells(ax, 0, y, n, S, ROW_COLORS[b])
        ax.text(-1, y + 0.4, f"row {b}: {n}", ha="right", va="center", fontsize=8)
    ax.text(0, top + 0.3, f"Day 28: a ({len(CONTEXTS)}, {S}) rectangle, "
            f"{len(CONTEXTS) * S} cells gathered for {sum(CONTEXTS)} real", fontsize=9.5)
    base = len(chunk_b)
    seen = [0] * len(CONTEXTS)
    for i, b in enumerate(chunk_b.tolist()):  # the chunks, in the index's order
        y = base - 1 - i
        cells(ax, 0, y, min(C, CONTEXTS[b] - seen[b]), C, ROW_COLORS[b])
        seen[b] += C
        ax.text(-1, y + 0.4, f"chunk {i}: row {b}", ha="right", va="center", fontsize=8)
    ax.text(0, base + 0.3, f"Day 50: {len(chunk_b)} chunks of C = {C}, "
            f"{len(chunk_b) * C} cells gathered", fontsize=9.5)
    ax.set_xlim(-9, S + 1)
    ax.set_ylim(-0.5, top + 1.2)
    ax.axis("off")
    ax.legend(handles=[Patch(facecolor=COLORS["waste"], alpha=0.35,
                             label="gathered, then masked")], loc="lower right", fontsize=8.5)
    ax.set_title("The same four rows, two ways to read them", loc="left", fontsize=11.5)


def workspace(ax) -> None:
    xs = range(len(BATCHES))
    for k, (path, color) in enumerate(zip(PATHS, (COLORS["reference"], COLORS["memory"]),
                                          strict=True)):
        mib = [workspace_bytes(path, lens, 9, 3, 64, 2) / 2**20 for _, lens in BATCHES]
        bars = ax.bar([x + (k - 0.5) * 0.38 for x in xs], mib, width=0.38, color=color,
                      label=path)
        for bar, v in zip(bars, mib, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, v + 0.6, f"{v:.1f}", ha="center",
                    fontsize=8.5)
    ax.set_xticks(list(xs), [name for name, _ in BATCHES])
    ax.set_ylabel("MiB per layer per decode step")
    ax.legend(fontsize=9)
    ax.set_title("Read workspace, SmolLM2-135M heads, bf16", loc="left", fontsize=11.5)


if __name__ == "__main__":
    fig, ax = figure(width=11, height=5.6)
    mapping(ax)
    save(fig, __file__, "gathered-mapping")
    fig, ax = figure(width=7, height=4.2)
    workspace(ax)
    save(fig, __file__, "workspace")
