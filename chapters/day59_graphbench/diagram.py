"""Day 59's figure: the arms, and the reduced run of them on this CPU.

    python chapters/day59_graphbench/diagram.py

writes build/figures/day59_graphbench/graphbench.png. Left: the three arms as boxes, each
pair joined by the one flag it differs in (from the frozen snapshot). Right: ITL p50 and p99
per arm from a reduced ``graphbench.run_arms`` on nanoserve-tiny on this CPU (two servers on
127.0.0.1, 16 requests of 4 in / 16 out at rate inf), with each arm's replay share. On a CPU
the windows replay eagerly, so the bars show the harness working, not a speed-up.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day59_graphbench.snapshot.itl import ARMS  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402


def arms(ax) -> None:
    ax.axis("off")
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    xs = {"graphs": 0.2, "eager": 3.7, "no-compile": 7.2}
    for name, x in xs.items():
        box(ax, x, 1.6, 2.6, 1.4, f"{name}\n" + "\n".join(ARMS[name]), "compute"
            if name == "graphs" else "reference", fontsize=8)
    for a, b, what in (("graphs", "eager", "windows"), ("eager", "no-compile", "compile")):
        ax.annotate("", (xs[b], 2.3), (xs[a] + 2.6, 2.3),
                    arrowprops=dict(arrowstyle="<->", color=COLORS["highlight"], lw=1.5))
        ax.text((xs[a] + 2.6 + xs[b]) / 2, 2.55, what, ha="center", fontsize=9)
    ax.text(5, 0.9, "every arm keeps the persistent batch", ha="center", fontsize=9)
    ax.set_title("The card's arms, one flag apart", loc="left", fontsize=11.5)


def cpu(ax) -> None:
    from chapters.day59_graphbench.claims import cpu_run

    rows = cpu_run()["report"]["rows"]
    for i, r in enumerate(rows):
        ax.bar(i - 0.2, r["itl_p50_ms"], width=0.38, color=COLORS["compute"],
               label="ITL p50" if i == 0 else None)
        ax.bar(i + 0.2, r["itl_p99_ms"], width=0.38, color=COLORS["waste"],
               label="ITL p99" if i == 0 else None)
        ax.text(i, r["itl_p99_ms"] * 1.05, f"replayed {r['share']:.0%}", ha="center",
                fontsize=9)
    ax.set_xticks(range(len(rows)), [r["arm"] for r in rows])
    ax.set_ylabel("ms")
    ax.set_ylim(0, max(r["itl_p99_ms"] for r in rows) * 1.3)
    ax.legend(loc="upper right", fontsize=8.5)
    ax.set_title("Reduced run, 2-core x86 CPU (eager replay)", loc="left", fontsize=11)


if __name__ == "__main__":
    fig, (a, b) = figure(width=13, height=4.2, ncols=2, gridspec_kw={"width_ratios": [1.6, 1]})
    arms(a)
    cpu(b)
    save(fig, __file__, "graphbench")
