"""Day 35's figure: the stress run as a timeline of rows, preemptions and aborts.

    python chapters/day35_stress/diagram.py

writes build/figures/day35_stress/stress-timeline.png. The run is the claims' (40 requests,
seed 7, prompts of 2-20 tokens, 1-40 tokens each, block_size 4, 8 slots, a 16-block pool, a 5%
chance per iteration of aborting a random live request), replayed host-only: the live scheduler
over integer tokens, with the stress test's abort rule and random stream, and no model. With EOS
ignored the schedule depends only on lengths, so the replay reproduces the run's counts exactly
(a claim of the chapter checks it against the run). Nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chapters.day35_stress.claims import BLOCKS, REQUESTS, SLOTS, replay  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def main() -> None:
    t = replay()
    fig, (top, bottom) = figure(width=11, height=8.2, nrows=2, sharex=True,
                                gridspec_kw={"height_ratios": [3.2, 1.0], "hspace": 0.08})
    for i, lane in enumerate(t["lanes"]):
        y = REQUESTS - 1 - i
        decode = [(it - 1, 1) for it, kind in lane if kind == "decode"]
        prefill = [(it - 1, 1) for it, kind in lane if kind == "prefill"]
        top.broken_barh(decode, (y + 0.15, 0.7), facecolors=COLORS["compute"])
        top.broken_barh(prefill, (y + 0.15, 0.7), facecolors=COLORS["highlight"])
    for it, i, _ in t["preempted"]:
        top.plot(it - 1, REQUESTS - 1 - i + 0.5, marker="X", color=COLORS["waste"],
                 markersize=7, markeredgecolor=COLORS["paper"], markeredgewidth=0.6)
    for it, i in t["aborted"]:
        top.plot(it - 1, REQUESTS - 1 - i + 0.5, marker="D", color=COLORS["ink"],
                 markersize=5)
    top.set_ylim(0, REQUESTS)
    top.set_yticks([REQUESTS - 0.5 - i for i in range(0, REQUESTS, 5)],
                   [f"r{i}" for i in range(0, REQUESTS, 5)])
    top.set_ylabel("request (arrival order)")
    top.grid(axis="y", visible=False)
    top.set_title(f"{REQUESTS} requests through {BLOCKS} blocks and {SLOTS} slots: "
                  f"{len(t['preempted'])} preemptions, {len(t['aborted'])} aborts, "
                  f"{t['iterations']} iterations", fontsize=11.5, loc="left")
    top.legend(handles=[
        Patch(color=COLORS["highlight"], label="prefill (admission or resume)"),
        Patch(color=COLORS["compute"], label="decode"),
        Line2D([], [], marker="X", color=COLORS["waste"], linestyle="none", markersize=8,
               label="preempted"),
        Line2D([], [], marker="D", color=COLORS["ink"], linestyle="none", markersize=5,
               label="aborted")],
        loc="upper right", fontsize=9, ncols=2, framealpha=0.9, frameon=True)

    x = range(t["iterations"])
    bottom.step(x, t["held"], where="post", color=COLORS["memory"], linewidth=1.3,
                label=f"blocks held (pool of {BLOCKS})")
    bottom.step(x, t["rows"], where="post", color=COLORS["compute"], linewidth=1.3,
                label=f"requests scheduled (of {SLOTS} slots)")
    bottom.axhline(BLOCKS, color=COLORS["reference"], linestyle="--", linewidth=0.9)
    bottom.set_ylim(0, BLOCKS + 9)
    bottom.set_xlim(-2, t["iterations"] + 2)
    bottom.set_xlabel("iteration (one schedule() and one model step)")
    bottom.legend(loc="upper right", fontsize=9, ncols=2)
    fig.suptitle("Day 35: the stress run, replayed host-only (seed 7, prompts 2-20 tokens, "
                 "1-40 tokens each, 5% abort chance per iteration)", fontsize=12,
                 fontweight="bold", y=0.95)
    save(fig, __file__, "stress-timeline")


if __name__ == "__main__":
    main()
