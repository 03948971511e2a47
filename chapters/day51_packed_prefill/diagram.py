"""Day 51's figure: the issue's eight prompts padded and packed, and the scores each way costs.

    python chapters/day51_packed_prefill/diagram.py

writes build/figures/day51_packed_prefill/packed-vs-padded.png. Left: the positions a prefill
runs, laid out on one axis: padded, every prompt takes the longest one's 90; packed, each takes
its own length. Right: the 235 x 235 score matrix of the packed stream, from the snapshot's
``block_diagonal_mask``: what each prompt's causal attention uses, and what one mask over the
whole stream would compute and discard. Nothing is timed and no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chapters.day51_packed_prefill.snapshot.packed import block_diagonal_mask  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

LENGTHS = [5, 12, 40, 3, 90, 17, 8, 60]
T, N = max(LENGTHS), sum(LENGTHS)


def streams(ax) -> None:
    shades = [COLORS["compute"], "#6f9bd1"]
    for b, n in enumerate(LENGTHS):
        ax.barh(1, n, left=b * T, height=0.6, color=shades[b % 2], edgecolor="white", lw=0.5)
        ax.barh(1, T - n, left=b * T + n, height=0.6, color=COLORS["waste"], alpha=0.3,
                edgecolor="none")
        ax.text(b * T + T / 2, 1.42, f"{n}", ha="center", fontsize=8.5, color=COLORS["ink"])
    start = 0
    for b, n in enumerate(LENGTHS):
        ax.barh(0, n, left=start, height=0.6, color=shades[b % 2], edgecolor="white", lw=0.5)
        start += n
    ax.set_yticks([0, 1], [f"packed (1, {N})\n{N} positions",
                           f"padded ({len(LENGTHS)}, {T})\n{len(LENGTHS) * T} positions"])
    ax.set_xlim(0, len(LENGTHS) * T)
    ax.set_ylim(-0.6, 1.8)
    ax.set_xlabel("positions the prefill runs through every layer")
    ax.grid(axis="y", visible=False)
    ax.legend(handles=[Patch(color=COLORS["compute"], label="a prompt's real tokens"),
                       Patch(color=COLORS["waste"], alpha=0.3, label="padding to 90")],
              loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=2, fontsize=9)
    share = 1 - N / (len(LENGTHS) * T)
    ax.set_title(f"Eight prompts, one forward: {share:.1%} of the rectangle is padding",
                 loc="left", fontsize=11.5)


def scores(ax) -> None:
    mask = block_diagonal_mask(LENGTHS).numpy()  # (N, N)
    seq = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    same = seq[:, None] == seq[None, :]
    img = np.empty((N, N, 3))
    img[...] = to_rgb(COLORS["waste"])
    img[~same] = 0.25 * img[~same] + 0.75  # faded: scores a single mask would throw away
    img[same & ~mask] = to_rgb(COLORS["muted"])
    img[mask] = to_rgb(COLORS["compute"])
    ax.imshow(img, interpolation="nearest")
    ax.set_xlabel("key (position in the stream)")
    ax.set_ylabel("query")
    ax.grid(False)
    loop = sum(n * n for n in LENGTHS)
    ax.set_title(f"Scores: {loop:,} (a loop) vs {N * N:,} (one mask)", loc="left",
                 fontsize=11.5)
    ax.legend(handles=[Patch(color=COLORS["compute"], label="causal, within a prompt"),
                       Patch(color=COLORS["muted"], label="later keys, same prompt"),
                       Patch(color=COLORS["waste"], alpha=0.3, label="another prompt")],
              loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=1, fontsize=9)


if __name__ == "__main__":
    fig, (left, right) = figure(width=13, height=5.2, ncols=2,
                                gridspec_kw={"width_ratios": [1.7, 1]})
    streams(left)
    scores(right)
    save(fig, __file__, "packed-vs-padded")
