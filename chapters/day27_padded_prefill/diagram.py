"""Day 27's figures: the padded (4 x 17) batch, and the mask one short row sees.

    python chapters/day27_padded_prefill/diagram.py

writes build/figures/day27_padded_prefill/padded-batch.png and mask.png. The lengths are the
claims' (5, 17, 1 and 9 tokens); nothing is measured, so no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from diagrams import COLORS, figure, save  # noqa: E402

LENGTHS = [5, 17, 1, 9]
B, T = len(LENGTHS), max(LENGTHS)


def padded_batch() -> None:
    fig, ax = figure(width=10, height=4.0)
    for b, n in enumerate(LENGTHS):
        y = B - 1 - b
        for t in range(T):
            real = t < n
            ax.add_patch(Rectangle((t, y), 0.92, 0.86,
                                   facecolor=COLORS["compute"] if real else COLORS["waste"],
                                   alpha=1.0 if real else 0.28, edgecolor="none"))
            ax.text(t + 0.46, y + 0.43, str(t) if real else "0", ha="center", va="center",
                    fontsize=8.5, color="white" if real else COLORS["waste"])
        # the column each row is read back at: its own last real token
        ax.add_patch(Rectangle((n - 1 - 0.04, y - 0.04), 1.0, 0.94, fill=False,
                               edgecolor=COLORS["highlight"], linewidth=2.4))
        ax.text(-0.3, y + 0.43, f"row {b}: {n:2d} token{'s' if n > 1 else ' '}", ha="right",
                va="center", fontsize=10)
    ax.set_xlim(-4.6, T + 0.2)
    ax.set_ylim(-1.0, B + 0.1)
    ax.axis("off")
    ax.text(T / 2, -0.55, "column t of the (4, 17) batch; the number in each cell is the "
            "position the token is given", ha="center", fontsize=9.5, color=COLORS["ink"])
    ax.legend(handles=[
        Patch(color=COLORS["compute"], label="real token: K/V written to its own cell"),
        Patch(color=COLORS["waste"], alpha=0.28,
              label="padding: id 0, position 0, write cell -1 (nothing stored)"),
        Patch(fill=False, edgecolor=COLORS["highlight"], linewidth=2.2,
              label="the column each row's logits are read from: its own last real token")],
        loc="upper center", bbox_to_anchor=(0.5, 0.02), fontsize=9.5, ncols=1)
    real = sum(LENGTHS)
    fig.suptitle(f"One forward for four prompts: {B * T} positions, {real} real, "
                 f"{B * T - real} padding ({1 - real / (B * T):.1%})",
                 fontsize=12.5, fontweight="bold", x=0.5, y=0.98)
    save(fig, __file__, "padded-batch")


def mask() -> None:
    """Row 0 (5 tokens) in the (4, 17) batch: which key each of its 17 query columns may see."""
    n = LENGTHS[0]
    positions = list(range(n)) + [0] * (T - n)
    fig, ax = figure(width=7.8, height=6.4)
    for t in range(T):
        for j in range(T):
            visible = j <= positions[t] and j < n
            if visible:
                color = COLORS["compute"] if t < n else COLORS["waste"]
            else:
                color = COLORS["muted"]
            ax.add_patch(Rectangle((j, T - 1 - t), 0.9, 0.9, facecolor=color, edgecolor="none",
                                   alpha=1.0 if t < n or not visible else 0.55))
    ax.axvline(n - 0.05, color=COLORS["ink"], linestyle="--", linewidth=1.0)
    ax.text(n + 0.15, T + 0.3, "j < context length (5)", fontsize=9.5, va="bottom")
    ax.set_xticks([j + 0.45 for j in range(T)], [str(j) for j in range(T)], fontsize=8.5)
    ax.set_yticks([T - 1 - t + 0.45 for t in range(T)],
                  [f"q{t} @ pos {positions[t]}" for t in range(T)], fontsize=8.5)
    ax.tick_params(length=0)
    ax.grid(False)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_xlim(-0.2, T + 0.1)
    ax.set_ylim(-0.3, T + 1.2)
    ax.set_xlabel("key j (the row's gathered context, width S = 17)")
    ax.set_ylabel("query column t and the position it is given")
    ax.legend(handles=[Patch(color=COLORS["compute"], label="a real token's visible keys"),
                       Patch(color=COLORS["waste"], alpha=0.55,
                             label="padding query: sees key 0 only (output discarded)"),
                       Patch(color=COLORS["muted"], label="masked")],
              loc="upper right", bbox_to_anchor=(1.0, -0.1), fontsize=9, ncols=3,
              handlelength=1.2, columnspacing=1.0)
    ax.set_title("The mask for the 5-token row: key j visible iff j <= position and j < 5",
                 fontsize=11.5)
    save(fig, __file__, "mask")


if __name__ == "__main__":
    padded_batch()
    mask()
