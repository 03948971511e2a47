"""Day 61's figure: when split-K pays, and how the merge puts a row back together.

    python chapters/day61_split_k/diagram.py

writes build/figures/day61_split_k/split-k.png. Left: for five Llama-3.2-1B-shaped batches
(32 query heads, 8 KV heads, 16-token blocks), the programs a one-pass launch makes beside the
programs after the frozen rule's split, against the 264 (two per SM of an H200) the rule aims
for. Right: one row of 1,800 random base-2 scores cut into segments of 512; each segment's
log-sum-exp, and its weight in the merge, 2^(lse_s - max) normalised, computed with the frozen
snapshot. Counting and arithmetic only; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day61_split_k.snapshot.split_k import (  # noqa: E402
    MIN_PROGRAMS,
    choose_splits,
    merge,
)
from diagrams import COLORS, figure, save  # noqa: E402

SHAPES = [("1 × 4,096", 1, 4096), ("2 × 32,768", 2, 32768), ("8 × 1,024", 8, 1024),
          ("4 ragged,\n≤ 4,000", 4, 4000), ("64 × 1,024", 64, 1024)]


def programs_panel(ax) -> None:
    x = range(len(SHAPES))
    one = [rows * 8 for _, rows, _ in SHAPES]
    split = [rows * 8 * choose_splits(rows, 8, -(-ctx // 16) * 16, 64)[0]
             for _, rows, ctx in SHAPES]
    ax.bar([i - 0.2 for i in x], one, width=0.4, color=COLORS["reference"], label="one pass")
    ax.bar([i + 0.2 for i in x], split, width=0.4, color=COLORS["compute"],
           label="after the rule")
    for i, (o, s) in enumerate(zip(one, split, strict=True)):
        ax.text(i - 0.2, o + 8, str(o), ha="center", fontsize=8.5)
        ax.text(i + 0.2, s + 8, str(s), ha="center", fontsize=8.5)
    ax.axhline(MIN_PROGRAMS, color=COLORS["highlight"], linewidth=1.5, linestyle="--")
    ax.text(-0.45, MIN_PROGRAMS + 40, f"{MIN_PROGRAMS}: two per SM of an H200",
            ha="left", fontsize=8.5, color=COLORS["highlight"])
    ax.set_xticks(list(x), [s for s, _, _ in SHAPES], fontsize=8.5)
    ax.set_xlabel("rows × tokens (Llama-3.2-1B attention)")
    ax.set_ylabel("attention programs launched")
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title("Split only when the grid is too small", fontsize=11, loc="left")


def merge_panel(ax) -> None:
    g = torch.Generator().manual_seed(61)
    n, seg = 1800, 512
    s = torch.randn(1, n, generator=g, dtype=torch.float64) * 2
    s[0, 600:700] += 6  # a run of strong keys inside segment 1
    v = torch.randn(n, 4, generator=g, dtype=torch.float64)
    parts, lses, bounds = [], [], []
    for lo in range(0, n, seg):
        hi = min(n, lo + seg)
        top = s[:, lo:hi].amax(1)
        p = torch.exp2(s[:, lo:hi] - top[:, None])
        parts.append(p @ v[lo:hi] / p.sum(1)[:, None])
        lses.append(top + torch.log2(p.sum(1)))
        bounds.append((lo, hi))
    lse = torch.stack(lses)[:, 0]
    w = torch.exp2(lse - lse.max())
    w = w / w.sum()
    whole = torch.softmax(s * torch.log(torch.tensor(2.0, dtype=torch.float64)), -1) @ v
    err = ((merge(torch.stack(parts), torch.stack(lses)) - whole).abs().max()
           / whole.abs().max()).item()
    for i, ((lo, hi), wi, li) in enumerate(zip(bounds, w.tolist(), lse.tolist(), strict=True)):
        ax.add_patch(Rectangle((lo, 1.15), hi - lo - 8, 0.35, color=COLORS["memory"],
                               alpha=0.45 + 0.15 * (i % 2)))
        ax.text((lo + hi) / 2, 1.32, f"segment {i}\nlse = {li:.1f}", ha="center",
                va="center", fontsize=8.5)
        ax.bar((lo + hi) / 2, wi, width=hi - lo - 8, color=COLORS["compute"])
        ax.text((lo + hi) / 2, wi + 0.02, f"w = {wi:.2f}", ha="center", fontsize=8.5)
    ax.set_xlim(0, n)
    ax.set_ylim(0, 1.6)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("context position (one row, 1,800 tokens, segments of 512)")
    ax.set_ylabel("merge weight 2^(lse - max), normalised")
    ax.set_title(f"Merge: weight each partial by its share of the denominator "
                 f"(vs one softmax: {err:.0e})", fontsize=11, loc="left")
    ax.legend(handles=[Patch(color=COLORS["memory"], alpha=0.5, label="a program's segment"),
                       Patch(color=COLORS["compute"], label="its weight in the merge")],
              loc="upper right", fontsize=8.5, bbox_to_anchor=(1.0, 0.7))


def main() -> None:
    fig, (left, right) = figure(width=13, height=5, ncols=2,
                                gridspec_kw={"width_ratios": [1, 1.25]})
    programs_panel(left)
    merge_panel(right)
    fig.suptitle("Split-K: more programs for narrow batches, one exact merge",
                 fontsize=12.5, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "split-k")


if __name__ == "__main__":
    main()
