"""Day 40's figure: what the serving benchmark measures, and when it sends.

    python chapters/day40_serving_bench/diagram.py

writes build/figures/day40_serving_bench/metrics-and-arrivals.png. Top: one streamed request as
the client sees it, with TTFT, the ITL gaps, TPOT and E2EL marked (a schematic with made-up
chunk times). Bottom: the send times of 30 requests at rate 4 from the benchmark's own seeded
generator (seed 0): Poisson (burstiness 1), bursty (burstiness 0.25), and rate inf. No server
is involved.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve.bench.workload import arrival_times  # noqa: E402

N = 30  # requests drawn for the arrival strip


def main() -> None:
    fig, (top, bottom) = figure(width=11, height=6.4, nrows=2,
                                gridspec_kw={"height_ratios": [1.1, 1.0], "hspace": 0.45})
    # one request: sent at 0, first chunk at 120 ms, then chunks every ~25 ms
    sent, first = 0.0, 120.0
    chunks = [first + 25.0 * i + (6.0 if i % 3 == 1 else 0.0) for i in range(8)]
    end = chunks[-1] + 3.0
    top.hlines(0, sent, end, color=COLORS["reference"], linewidth=1)
    top.plot([sent], [0], marker="o", color=COLORS["ink"])
    top.vlines(chunks, -0.25, 0.25, color=COLORS["compute"], linewidth=2.2)
    top.annotate("", xy=(first, 0.55), xytext=(sent, 0.55),
                 arrowprops=dict(arrowstyle="<->", color=COLORS["highlight"], lw=1.4))
    top.text(first / 2, 0.65, "TTFT: sent -> first content chunk", ha="center", fontsize=9)
    top.annotate("", xy=(chunks[2], -0.5), xytext=(chunks[1], -0.5),
                 arrowprops=dict(arrowstyle="<->", color=COLORS["memory"], lw=1.4))
    top.text((chunks[1] + chunks[2]) / 2, -0.78, "ITL: one gap\n(pooled over requests)",
             ha="center", fontsize=9, va="top")
    top.annotate("", xy=(chunks[-1], 0.55), xytext=(first, 0.55),
                 arrowprops=dict(arrowstyle="<->", color=COLORS["compute"], lw=1.4))
    top.text((first + chunks[-1]) / 2, 0.65, "TPOT = (E2EL - TTFT) / (output tokens - 1)",
             ha="center", fontsize=9)
    top.annotate("", xy=(end, 1.15), xytext=(sent, 1.15),
                 arrowprops=dict(arrowstyle="<->", color=COLORS["ink"], lw=1.2))
    top.text(end / 2, 1.25, "E2EL: sent -> stream closed (after data: [DONE])", ha="center",
             fontsize=9)
    top.set_ylim(-1.4, 1.7)
    top.set_yticks([])
    top.set_xlabel("ms after the request was sent (schematic)")
    top.set_title("one streamed request, as the client times it", fontsize=10.5, loc="left")

    patterns = [("rate 4, burstiness 1 (Poisson)", arrival_times(N, 4.0, 1.0, 0)),
                ("rate 4, burstiness 0.25 (bursty)", arrival_times(N, 4.0, 0.25, 0)),
                ("rate inf (all at once)", arrival_times(N, float("inf"), 1.0, 0))]
    colors = [COLORS["compute"], COLORS["waste"], COLORS["reference"]]
    for y, ((label, times), color) in enumerate(zip(patterns, colors, strict=True)):
        bottom.vlines(times, 2 - y - 0.3, 2 - y + 0.3, color=color, linewidth=2)
        bottom.text(-0.1, 2 - y, label, ha="right", va="center", fontsize=9)
    bottom.set_yticks([])
    bottom.set_xticks(range(0, int(max(max(t) for _, t in patterns)) + 1))
    bottom.set_xlim(-3.4, max(max(t) for _, t in patterns) + 0.3)
    bottom.set_xlabel(f"seconds after the first request ({N} requests, seed 0, the benchmark's "
                      f"own generator)")
    bottom.set_title("when the benchmark sends: gamma intervals with mean 1 / rate",
                     fontsize=10.5, loc="left")
    fig.suptitle("Day 40: the serving benchmark's four latencies and its arrival process",
                 fontsize=12, fontweight="bold", y=0.99)
    save(fig, __file__, "metrics-and-arrivals")


if __name__ == "__main__":
    main()
