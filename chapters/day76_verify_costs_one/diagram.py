"""Day 76's figure: what k proposals are worth, from the snapshot's formula alone.

    python chapters/day76_verify_costs_one/diagram.py

writes ``build/figures/day76_verify_costs_one/expected-tokens.png``. Left: the tokens one
verify step emits on average, ``expected_tokens(a, k)``, against the acceptance rate ``a`` for
k = 1, 2, 4 and 8, with the ceiling no k passes, ``1 / (1 - a)``. Right: the speed-up over
plain decoding against k at a = 0.8: a free proposer (c = 0, n-gram lookup) and a draft model
whose step costs a tenth of the target's (c = 0.1), each with a verify step that costs one
target step; and the free proposer again where the verify step costs one step per pass of the
small-M kernel, eight entries a pass. Nothing is timed here.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day76_verify_costs_one.snapshot.verify_cost import (  # noqa: E402
    expected_tokens,
    speedup,
)
from diagrams import COLORS, figure, save  # noqa: E402

KS = {1: COLORS["reference"], 2: COLORS["memory"], 4: COLORS["compute"], 8: COLORS["highlight"]}


def draw_tokens(ax) -> None:
    a_s = [i / 100 for i in range(0, 96)]
    ax.plot(a_s, [1 / (1 - a) for a in a_s], color=COLORS["ink"], lw=1, ls=":",
            label="no k passes 1 / (1 - a)")
    for k, color in KS.items():
        ax.plot(a_s, [expected_tokens(a, k) for a in a_s], color=color, lw=2, label=f"k = {k}")
    ax.set_ylim(1, 9.5)
    ax.set_xlabel("acceptance rate a")
    ax.set_ylabel("tokens per verify step")
    ax.set_title("What one verify step emits", fontsize=11, loc="left")
    ax.legend(fontsize=8, loc="upper left")


def draw_speedup(ax, a: float = 0.8, cap: int = 8) -> None:
    ks = list(range(1, 17))
    forwards = [-(-(1 + k) // cap) for k in ks]  # small-M passes over 1 + k entries
    curves = ((0.0, None, COLORS["compute"], "-", "n-gram, c = 0", None),
              (0.0, forwards, COLORS["waste"], "--",
               f"n-gram, each pass of {cap} entries one step", (-62, 2)),
              (0.1, None, COLORS["highlight"], "-", "draft, c = 0.1", (-48, -18)))
    for c, verify, color, ls, name, at in curves:
        ys = [speedup(a, k, c, v) for k, v in zip(ks, verify or [1.0] * len(ks), strict=True)]
        ax.plot(ks, ys, color=color, lw=2, ls=ls, marker="o", ms=3, label=name)
        best = max(ks, key=lambda k: (ys[k - 1], -k))
        if at is not None:
            ax.annotate(f"best k = {best}", (best, ys[best - 1]), textcoords="offset points",
                        xytext=at, fontsize=8, color=color)
    ax.axhline(1, color=COLORS["reference"], lw=1, ls=":")
    ax.set_xticks([1, 4, 7, 8, 12, 16])
    ax.set_ylim(0, 5.2)
    ax.set_xlabel("proposals per step k")
    ax.set_ylabel("speed-up over plain decoding")
    ax.set_title(f"Speed-up at a = {a}", fontsize=11, loc="left")
    ax.legend(fontsize=8, loc="lower right")


if __name__ == "__main__":
    fig, (left, right) = figure(width=10, height=4.2, ncols=2)
    draw_tokens(left)
    draw_speedup(right)
    save(fig, __file__, "expected-tokens")
