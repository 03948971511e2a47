"""Day 48's figure: the long soak's job mix, and what the soak checks from outside.

    python chapters/day48_soak/diagram.py

writes build/figures/day48_soak/soak.png. Left: the 10,000 jobs of
``make_jobs(10000, seed=0, disconnect_rate=0.2, chat=False)`` (the long run's workload, drawn
when the shipped model had no chat template) counted by kind: plain or streamed, read to the end
or abandoned by its client, greedy or sampled. Right: the soak's shape, clients against a
``nanoserve serve`` process and the four checks made from outside it. Nothing is sent to a
server and nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from diagrams import COLORS, box, figure, save  # noqa: E402
from nanoserve.bench.soak import make_jobs  # noqa: E402


def kind(job) -> str:
    if job.stream:
        return "stream,\nleft after\n0-4 chunks" if job.hang_up_chunks is not None else \
            "stream,\nread to\n[DONE]"
    return "plain,\nhung up after\n0-0.3 s" if job.hang_up_after is not None else \
        "plain,\nread to\nthe end"


def main() -> None:
    jobs = make_jobs(10_000, seed=0, disconnect_rate=0.2, chat=False)
    kinds = ["plain,\nread to\nthe end", "plain,\nhung up after\n0-0.3 s",
             "stream,\nread to\n[DONE]", "stream,\nleft after\n0-4 chunks"]
    greedy = [sum(1 for j in jobs if kind(j) == k and j.greedy) for k in kinds]
    sampled = [sum(1 for j in jobs if kind(j) == k and not j.greedy) for k in kinds]

    fig, (ax, bx) = figure(width=13, height=5.4, ncols=2,
                           gridspec_kw={"width_ratios": [1.0, 1.05]})
    xs = range(len(kinds))
    ax.bar(xs, greedy, color=COLORS["compute"], label="greedy: compared with the offline engine")
    ax.bar(xs, sampled, bottom=greedy, color=COLORS["reference"], label="sampled")
    for x, g, s in zip(xs, greedy, sampled, strict=True):
        ax.text(x, g + s + 60, f"{g + s:,}", ha="center", fontsize=9.5, color=COLORS["ink"])
    ax.set_xticks(list(xs))
    ax.set_xticklabels(kinds, fontsize=8.5)
    ax.set_ylabel("jobs")
    ax.set_ylim(0, max(g + s for g, s in zip(greedy, sampled, strict=True)) * 1.15)
    ax.set_title("the long soak's 10,000 jobs (seed 0, 20% told to hang up)")
    ax.legend(fontsize=9, loc="upper right")
    ax.grid(axis="x", visible=False)

    bx.set_xlim(0, 12)
    bx.set_ylim(0, 6.2)
    bx.axis("off")
    bx.set_title("the soak: checked from outside the server")
    box(bx, 0.0, 2.5, 2.1, 1.3, "64 clients\n(httpx,\nasyncio)", color="reference",
        fontsize=9)
    box(bx, 2.9, 2.5, 2.3, 1.3, "nanoserve\nserve\n(own process)", color="compute",
        fontsize=9)
    bx.annotate("", (2.85, 3.15), (2.15, 3.15),
                arrowprops=dict(arrowstyle="<->", color=COLORS["ink"], lw=1.2))
    bx.text(2.5, 4.0, "requests,\nhang-ups", ha="center", fontsize=8)
    checks = [("leaked blocks", "/metrics: KV usage\n== 0 at the end", 5.0),
              ("stuck requests", "/metrics: running, waiting\n== 0 within 5 s", 3.85),
              ("mismatches", "each greedy text ==\nthe offline LLM's", 2.7),
              ("memory", "/proc VmRSS: the end\nwithin 10% of the 1,000th", 1.55)]
    for name, how, y in checks:
        box(bx, 5.9, y, 2.7, 0.85, name, color="memory", fontsize=9)
        bx.text(8.75, y + 0.42, how, va="center", fontsize=8, color=COLORS["ink"])
        bx.annotate("", (5.85, y + 0.42), (5.25, 3.15),
                    arrowprops=dict(arrowstyle="->", color=COLORS["memory"], lw=1.0))
    bx.text(0.1, 0.6, "pass: all four hold, and no request failed", fontsize=9.5,
            color=COLORS["ink"])
    fig.suptitle("Day 48: the soak (nanoserve-tiny, float32, 2-core CPU server)", fontsize=12,
                 fontweight="bold")
    save(fig, __file__, "soak")


if __name__ == "__main__":
    main()
