"""Day 7's figures: the work the KV cache removes, and the memory a contiguous cache reserves.

Left: token-forwards per generation step for a 16-token prompt and 64 new tokens. Without a cache
step i runs all P + i tokens again (a growing ramp, a triangle in total); with the cache the first
step runs the prompt once and every later step runs one token. Right: the contiguous cache as
one max-length row per sequence, used positions against reserved-but-unused ones.

    .venv/bin/python chapters/day07_kv_cache/diagram.py
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch  # noqa: E402

from diagrams import COLORS, figure, save  # noqa: E402

P, N = 16, 64  # the counting workload of claims.py


def work_per_step(p: int, n: int) -> tuple[list[int], list[int]]:
    """Token positions run through the model at each of the n steps, uncached and cached."""
    uncached = [p + i for i in range(n)]  # step i re-runs the prompt and the i tokens so far
    cached = [p] + [1] * (n - 1)  # prefill once, then one token per decode step
    return uncached, cached


def work_figure():
    uncached, cached = work_per_step(P, N)
    steps = list(range(1, N + 1))
    fig, (ax, bx) = figure(width=12, height=4.6, ncols=2,
                           gridspec_kw={"width_ratios": [1, 1.15], "wspace": 0.28})

    ax.fill_between(steps, uncached, step="mid", color=COLORS["waste"], alpha=0.25, lw=0)
    ax.step(steps, uncached, where="mid", color=COLORS["waste"], lw=2,
            label=f"no cache: {sum(uncached):,} token-forwards")
    ax.fill_between(steps, cached, step="mid", color=COLORS["compute"], alpha=0.35, lw=0)
    ax.step(steps, cached, where="mid", color=COLORS["compute"], lw=2.5, zorder=3,
            label=f"KV cache: {sum(cached)} token-forwards")
    ax.plot([1], [P], "o", color=COLORS["compute"], ms=7, zorder=4)
    ax.annotate("prefill: the prompt, once", xy=(1.3, P + 0.5), xytext=(9, 34),
                arrowprops=dict(arrowstyle="->", color=COLORS["ink"]), fontsize=10)
    ax.annotate("decode: one token per step", xy=(40, 1), xytext=(24, 12),
                arrowprops=dict(arrowstyle="->", color=COLORS["ink"]), fontsize=10)
    ax.set_xlim(0, N + 1)
    ax.set_ylim(0, P + N + 6)
    ax.set_xlabel("generation step (new token number)")
    ax.set_ylabel("tokens run through the model")
    ax.set_title(f"Work per step (P={P}, N={N})")
    ax.legend(loc="upper left")

    # Right panel: a contiguous cache reserves max_len positions per sequence up front.
    tmax = 2048
    used = [("request A", 500), ("request B", 1730), ("request C", 120), ("request D", 910)]
    for row, (_, n_used) in enumerate(used):
        y = len(used) - 1 - row
        bx.barh(y, n_used, height=0.62, color=COLORS["memory"], edgecolor=COLORS["ink"], lw=0.8)
        bx.barh(y, tmax - n_used, left=n_used, height=0.62, color=COLORS["waste"], alpha=0.3,
                edgecolor=COLORS["ink"], lw=0.8, hatch="//")
        inside = n_used > 250
        bx.text(n_used / 2 if inside else n_used + 30, y, f"{n_used}", va="center",
                ha="center" if inside else "left", color="white" if inside else COLORS["ink"],
                fontsize=10, fontweight="bold")
        bx.text(max(n_used + (tmax - n_used) / 2, 560), y, f"{tmax - n_used} idle", ha="center",
                va="center", color=COLORS["ink"], fontsize=10)
    total_used = sum(n for _, n in used)
    share = 1 - total_used / (tmax * len(used))
    bx.set_yticks(range(len(used)), [name for name, _ in reversed(used)])
    bx.set_xlim(0, tmax)
    bx.set_ylim(-0.6, len(used) - 0.1)
    bx.set_xticks([0, 512, 1024, 1536, 2048])
    bx.axvline(tmax, color=COLORS["ink"], lw=1.5)
    bx.grid(axis="y", visible=False)
    bx.set_xlabel("position in the reservation (max_len = 2048)")
    bx.set_title(f"Contiguous cache: {share:.0%} of it reserved, never used")
    handles = [Patch(facecolor=COLORS["memory"], edgecolor=COLORS["ink"], label="K/V written"),
               Patch(facecolor=COLORS["waste"], alpha=0.3, edgecolor=COLORS["ink"], hatch="//",
                     label="reserved, never written")]
    bx.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    return fig


if __name__ == "__main__":
    save(work_figure(), __file__, "kv-cache-work-and-waste")
