"""Day 28's figure: the (B, S) rectangle one batched decode step gathers.

    python chapters/day28_batched_decode/diagram.py

writes build/figures/day28_batched_decode/rectangle.png. The contexts are the claims' (4, 41 and
12 cached tokens, one new token each); nothing is measured, so no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from diagrams import COLORS, figure, save  # noqa: E402

CONTEXTS = [4, 41, 12]


def rectangle() -> None:
    S = max(CONTEXTS) + 1  # the longest row's context plus its new token
    fig, ax = figure(width=11, height=3.9)
    rows = len(CONTEXTS)
    for b, n in enumerate(CONTEXTS):
        y = (rows - 1 - b) * 1.3
        for j in range(S):
            if j < n:
                style = {"facecolor": COLORS["memory"]}
            elif j == n:
                style = {"facecolor": COLORS["compute"]}
            else:
                style = {"facecolor": COLORS["paper"], "edgecolor": COLORS["waste"],
                         "hatch": "////", "linewidth": 0.0}
            ax.add_patch(Rectangle((j, y), 0.9, 0.9, **style))
        ax.text(-0.6, y + 0.45, f"row {b}: {n} cached + 1 new", ha="right", va="center",
                fontsize=10)
        need = n + 1
        ax.text(S + 0.6, y + 0.45, f"needs {need:2d}, gathers {S}  ({S / need:.1f}x)",
                ha="left", va="center", fontsize=10,
                color=COLORS["waste"] if need < S else COLORS["ink"],
                fontweight="bold" if b == 0 else "normal")
    ax.annotate("", xy=(0, rows * 1.3 + 0.05), xytext=(S - 0.1, rows * 1.3 + 0.05),
                arrowprops={"arrowstyle": "<->", "color": COLORS["ink"], "linewidth": 1.0})
    ax.text(S / 2, rows * 1.3 + 0.2, f"S = {S}: the longest context in the batch, plus its "
            "new token", ha="center", va="bottom", fontsize=10)
    ax.set_xlim(-9.5, S + 15)
    ax.set_ylim(-1.9, rows * 1.3 + 0.9)
    ax.axis("off")
    needed = sum(n + 1 for n in CONTEXTS)
    ax.text(S / 2, -0.55, f"the batch gathers {rows} x {S} = {rows * S} positions per layer "
            f"and uses {needed}", ha="center", va="center", fontsize=10.5)
    ax.legend(handles=[
        Patch(color=COLORS["memory"], label="cached context (read)"),
        Patch(color=COLORS["compute"], label="the new token (written, then read)"),
        Patch(facecolor=COLORS["paper"], edgecolor=COLORS["waste"], hatch="////",
              label="gathered, then masked: the debt")],
        loc="upper center", bbox_to_anchor=(0.5, 0.13), ncols=3, fontsize=9.5)
    ax.set_title("One decode step for three rows: every row is gathered at the longest "
                 "row's width", fontsize=12.5)
    save(fig, __file__, "rectangle")


if __name__ == "__main__":
    rectangle()
