"""Day 44's figure: the prefix cache's hits, request by request, against the formula.

    .venv/bin/python chapters/day44_prefix_counting/diagram.py

writes build/figures/day44_prefix_counting/hits-per-request.png.

One panel per case of the chapter (A to E: N requests of L prompt tokens sharing P, block size
B), one bar per request in the order they were sent: prompt tokens found cached (green) and
computed (blue), read from ``llm.stats`` of the live engine as in claims.py (shipped
nanoserve-tiny, float32, one request per ``generate`` call). The dashed line is what the frozen
formula says each later request hits, B * floor(min(P, L - 1) / B); the grey tick is P, the
shared prefix, so the gap between the two is what the block boundary and the last-token rule
keep back.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch  # noqa: E402

from chapters.day44_prefix_counting.claims import CASES, in_process  # noqa: E402
from chapters.day44_prefix_counting.snapshot.counting import expected_hits  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def draw() -> None:
    per_request = in_process()["per_request"]
    fig, axes = figure(width=12, height=4.2, ncols=len(CASES), sharey=True)
    for ax, (name, (n, length, prefix, bs)) in zip(axes, CASES.items(), strict=True):
        rows = per_request[name]
        xs = range(1, len(rows) + 1)
        hits = [h for h, _ in rows]
        computed = [q - h for h, q in rows]
        ax.bar(xs, hits, color=COLORS["memory"], width=0.7)
        ax.bar(xs, computed, bottom=hits, color=COLORS["compute"], width=0.7)
        each = expected_hits(2, length, prefix, bs)  # what one later request hits
        ax.axhline(each, color=COLORS["ink"], ls="--", lw=1)
        ax.axhline(prefix, color=COLORS["reference"], ls=":", lw=1)
        ax.set_title(f"case {name}\nN {n}, L {length}, P {prefix}, B {bs}", fontsize=9)
        ax.set_xticks(list(xs))
        ax.set_xlabel("request")
        total = sum(hits)
        ax.text(0.5, 0.97, f"{total:,} of {sum(q for _, q in rows):,} hit", fontsize=9,
                transform=ax.transAxes, ha="center", va="top")
    axes[0].set_ylabel("prompt tokens")
    axes[0].set_ylim(0, 250)
    handles = [Patch(color=COLORS["memory"], label="found cached (hits)"),
               Patch(color=COLORS["compute"], label="computed"),
               Patch(facecolor="none", edgecolor=COLORS["ink"], ls="--",
                     label="formula: B·⌊min(P, L − 1)/B⌋ per later request"),
               Patch(facecolor="none", edgecolor=COLORS["reference"], ls=":",
                     label="P, the shared prefix")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=9,
               bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("Prefix-cache hits request by request: the first computes everything, every "
                 "later one hits what the formula says", fontsize=12, fontweight="bold", y=1.03)
    save(fig, __file__, "hits-per-request")


if __name__ == "__main__":
    draw()
