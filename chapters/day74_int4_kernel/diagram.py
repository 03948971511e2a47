"""Day 74's figure: the path of one int4 weight from the checkpoint into the kernel's layout.

    python chapters/day74_int4_kernel/diagram.py

writes build/figures/day74_int4_kernel/layout.png, three rows:

- compressed-tensors' ``weight_packed``: output n's row of int32 words along its inputs, word c
  holding inputs 8c..8c+7, each as q + 8, the first in the lowest bits;
- the kernel's block: thirty-two outputs, chunk by chunk, each chunk two 64-byte lines (the
  block's first sixteen outputs, then the rest), a 32-bit lane per output;
- one lane: positions 0-7 holding inputs 0, 2, 4, 6, 1, 3, 5, 7 as two's complement nibbles,
  read as two 16-bit words (the even inputs, the odd inputs) by the bf16 path, and nibble p
  widened by a shift of 4p and a table lookup by the float32 path.

The layout is the snapshot's (``snapshot/nibbles.py``); nothing is measured.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Rectangle  # noqa: E402

from chapters.day74_int4_kernel.snapshot.nibbles import K_OF_P  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402


def row_of_words(ax, y: float) -> None:
    ax.text(0, y + 1.15, "compressed-tensors: weight_packed (N, K/8) int32, one output's row",
            fontsize=10, fontweight="bold")
    for c in range(4):
        box(ax, c * 4.2, y, 4.0, 0.8, f"word {c}: inputs {8 * c}..{8 * c + 7}",
            color="reference", fontsize=8)
    ax.text(17.0, y + 0.4, "...  each value stored as q + 8", fontsize=8, va="center")


def block(ax, y: float) -> None:
    ax.text(0, y + 2.25, "the kernel: a block of 32 outputs, K/8 chunks of 128 bytes",
            fontsize=10, fontweight="bold")
    for c in range(3):
        x0 = c * 7.2
        box(ax, x0, y + 1.0, 7.0, 0.8, f"chunk {c}, line 0: outputs 0-15", color="memory",
            fontsize=8)
        box(ax, x0, y, 7.0, 0.8, f"chunk {c}, line 1: outputs 16-31", color="memory",
            fontsize=8)
    ax.text(21.8, y + 0.9, "...", fontsize=12, va="center")
    for j in range(16):  # lanes of the first line, drawn small above it
        ax.add_patch(Rectangle(
            (j * 7.0 / 16, y + 1.82), 7.0 / 16, 0.22, facecolor=COLORS["highlight"]
            if j == 5 else COLORS["muted"], edgecolor=COLORS["ink"], linewidth=0.4))
    ax.text(7.3, y + 1.93, "16 lanes of 32 bits: one per output (lane 5 = output 5)",
            fontsize=8, va="center")


def lane(ax, y: float) -> None:
    ax.text(0, y + 1.6, "one lane: 8 two's complement nibbles (position 0 lowest)",
            fontsize=10, fontweight="bold")
    w = 2.3
    for p in range(8):
        x0 = (7 - p) * w  # highest position on the left, as bits are written
        color = "compute" if p < 4 else "highlight"
        box(ax, x0, y + 0.4, w - 0.1, 0.8, f"p{p}: k{K_OF_P[p]}", color=color, fontsize=9)
    ax.text(0, y, "high 16-bit word: odd inputs", fontsize=8, color=COLORS["highlight"])
    ax.text(4 * w, y, "low 16-bit word: even inputs", fontsize=8, color=COLORS["compute"])
    ax.text(0, y - 0.6, "float32 rows: (lane >> 4p) as a vpermps index: table[low 4 bits] "
            "= 0..7, -8..-1", fontsize=8)
    ax.text(0, y - 1.1, "bf16 rows: each word >> 4i, vpermw: the lane becomes the bf16 pair "
            "(w[2i], w[2i+1]) for dpbf16", fontsize=8)


def main() -> None:
    fig, ax = figure(width=10, height=6.2)
    ax.set_xlim(-0.3, 23.5)
    ax.set_ylim(-1.5, 9.6)
    ax.axis("off")
    row_of_words(ax, 7.4)
    block(ax, 3.6)
    lane(ax, 0.4)
    save(fig, __file__, "layout")


if __name__ == "__main__":
    main()
