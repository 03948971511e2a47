"""Day 32's figures: the engine's decode steps against the floor drawn for them.

    python chapters/day32_roofline/diagram.py

writes into build/figures/day32_roofline/:

- ``roofline.png``: milliseconds per decode step against rows, log-log. The memory term (bytes
  over the measured bandwidth), the compute term (FLOPs over the measured peak), the floor (the
  larger of the two, drawn thick), the ridge where they cross, and the engine's measured steps at
  1 to 64 rows, each labelled with its distance above the floor.
- ``attainable.png``: the same measurement as a classic roofline: GFLOP/s against FLOPs per byte
  read, log-log. The roof is the measured bandwidth times the intensity up to the ridge and the
  measured peak after it; each step sits at its intensity with the rate it achieved.

Both are measured when the figure is drawn (``claims.measured``: one thread, interleaved rounds),
so they belong to the machine that drew them, named in their titles.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from chapters.day32_roofline.claims import measured  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def plain_numbers(ax) -> None:
    """Log axes labelled 20, 50, 100 rather than powers of ten."""
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def draw_steps(ax, rf, cpu: str) -> None:
    c, m, ctx = rf.cost, rf.machine, rf.context
    rows = np.geomspace(1, 64, 200)
    memory = np.array([c.bytes(r, ctx) / m.bandwidth for r in rows]) * 1e3
    compute = np.array([c.flops(r, ctx) / m.peak for r in rows]) * 1e3
    ax.plot(rows, memory, "--", color=COLORS["memory"], lw=1.2,
            label=f"reading: bytes / {m.bandwidth / 1e9:.1f} GB/s")
    ax.plot(rows, compute, "--", color=COLORS["compute"], lw=1.2,
            label=f"multiplying: FLOPs / {m.peak / 1e9:.0f} GFLOP/s")
    ax.plot(rows, np.maximum(memory, compute), color=COLORS["ink"], lw=2.4,
            label="the floor: the larger of the two")
    ridge = rf.ridge
    if ridge <= 64:
        ax.axvline(ridge, color=COLORS["reference"], lw=1, ls=":")
        ax.text(ridge * 1.05, memory.min() * 0.62, f"ridge: {ridge:.1f} rows",
                color=COLORS["reference"], fontsize=9)
    xs = list(rf.steps)
    ys = [rf.steps[r] * 1e3 for r in xs]
    ax.plot(xs, ys, "o", color=COLORS["highlight"], ms=7, mec=COLORS["ink"], mew=0.6,
            label="the engine's decode step, labelled measured / floor", zorder=5)
    for r, y in zip(xs, ys, strict=True):
        ax.annotate(f"{rf.distance(r):.2f}x", (r, y), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=8.5, color=COLORS["ink"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r) for r in xs])
    ax.set_xticks([], minor=True)
    plain_numbers(ax)
    ax.set_ylim(memory.min() * 0.5, max(max(ys), compute.max()) * 1.6)
    ax.set_xlabel("rows in the decode step")
    ax.set_ylabel("milliseconds per step")
    ax.legend(fontsize=8.5, loc="upper left")
    ax.set_title(f"Decode steps against their floor: SmolLM2-135M shape, float32, one "
                 f"thread\n{cpu}", fontsize=10.5, loc="left")


def draw_attainable(ax, rf, cpu: str) -> None:
    c, m, ctx = rf.cost, rf.machine, rf.context
    intensity = np.geomspace(0.1, 100, 300)
    ax.plot(intensity, np.minimum(m.peak, intensity * m.bandwidth) / 1e9, color=COLORS["ink"],
            lw=2.4, label="the roof: min(peak, bandwidth x intensity)")
    ax.axvline(m.balance, color=COLORS["reference"], lw=1, ls=":")
    ax.text(m.balance * 1.08, m.peak / 1e9 * 0.05, f"balance: {m.balance:.1f} FLOP/byte",
            color=COLORS["reference"], fontsize=9)
    for r, s in rf.steps.items():
        x, y = c.intensity(r, ctx), c.flops(r, ctx) / s / 1e9
        ax.plot(x, y, "o", color=COLORS["highlight"], ms=7, mec=COLORS["ink"], mew=0.6,
                zorder=5)
        ax.annotate(f"{r}", (x, y), textcoords="offset points", xytext=(6, -10), fontsize=8.5)
    ax.plot([], [], "o", color=COLORS["highlight"], mec=COLORS["ink"],
            label="the engine's decode step, labelled by its rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_numbers(ax)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("arithmetic intensity: FLOPs per byte read")
    ax.set_ylabel("GFLOP/s")
    ax.legend(fontsize=8.5, loc="upper left")
    ax.set_title(f"The same steps as a roofline: SmolLM2-135M shape, float32, one thread\n{cpu}",
                 fontsize=10.5, loc="left")


if __name__ == "__main__":
    from nanoserve.bench.hardware import cpu_model

    rf = measured()
    fig, ax = figure(width=8, height=5)
    draw_steps(ax, rf, cpu_model())
    fig.tight_layout()
    save(fig, __file__, "roofline")

    fig, ax = figure(width=8, height=5)
    draw_attainable(ax, rf, cpu_model())
    fig.tight_layout()
    save(fig, __file__, "attainable")
