"""Day 33's figures: what one request holds under each policy, and the table as bars and lanes.

    python chapters/day33_preemption/diagram.py

writes two files into build/figures/day33_preemption/:

- incremental-allocation.png: left, one request of the table's workload (5-token prompt, 24
  tokens of budget, block_size 4) as blocks, under Week 8's reservation and under Day 33's
  block-at-a-time rule, with the one allocation rule and the new preempt edge; right, iterations
  per pool and policy, with occupancy and preemptions written on the bars.
- preemption-timeline.png: the four requests as lanes over iterations for the 48- and 96-token
  pools under both policies, with every preemption and every resume marked.

Everything is counted by the frozen Day 33 scheduler over integer tokens; nothing is timed and no
model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from chapters.day14_block_allocator.snapshot.block_allocator import (  # noqa: E402
    BlockAllocator,
)
from chapters.day33_preemption.snapshot.harness import run_scheduled  # noqa: E402
from chapters.day33_preemption.snapshot.request import Request  # noqa: E402
from chapters.day33_preemption.snapshot.scheduler import Scheduler  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

SLOTS, BS, PROMPT, BUDGET, N = 4, 4, 5, 24, 4  # the table's workload
POOLS = (48, 96, 128)
NAMES = {"reserve": "Week 8 (reserve)", "incremental": "Day 33 (incremental)"}


def trace(pool: int, policy: str) -> dict:
    """The harness's loop, recording what each request did in each iteration.

    lanes[i][it] is "prefill", "decode" or absent; preempted / resumed list (iteration, i).
    """
    sched = Scheduler(BlockAllocator(pool // BS, BS), SLOTS, allocation=policy)
    reqs = [Request(i, [1] * PROMPT, max_tokens=BUDGET) for i in range(N)]
    for r in reqs:
        sched.add(r)
    lanes: list[dict[int, str]] = [{} for _ in reqs]
    preempted, resumed, it = [], [], 0
    while True:
        out = sched.schedule()
        if out.num_scheduled == 0:
            break
        it += 1
        preempted += [(it, r.request_id) for r in out.preempted]
        for r in out.admitted:
            lanes[r.request_id][it] = "prefill"
            if r.num_preemptions:
                resumed.append((it, r.request_id))
        for r in out.decode:
            lanes[r.request_id][it] = "decode"
        for r in out.admitted + out.decode:
            r.append_token(1)
    counted = run_scheduled(SLOTS, BS, pool, PROMPT, [BUDGET], N, policy)
    assert (it, len(preempted)) == (counted["forward_passes"], counted["preemptions"])
    return {"iterations": it, "lanes": lanes, "preempted": preempted, "resumed": resumed,
            "occupancy": counted["occupancy"], "recomputed": counted["recomputed_tokens"]}


def arrow(ax, start, end, color, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={rad}",
                                 arrowstyle="-|>", mutation_scale=14, linewidth=1.5,
                                 color=color))


def one_request(ax) -> None:
    """Eight blocks of four cells: what the request holds, and when Day 33 buys each."""
    ax.set_xlim(-0.2, 10.4)
    ax.set_ylim(-0.2, 10.6)
    ax.axis("off")
    x0, w, gap = 1.9, 0.92, 0.12
    final_tokens = PROMPT + BUDGET - 1  # the last sampled token never enters the cache

    def blocks(y: float, held: int, label: str) -> None:
        ax.text(x0 - 0.15, y + 0.35, label, ha="right", va="center", fontsize=9.5,
                fontweight="bold")
        for b in range(8):
            x = x0 + b * (w + gap)
            if b < held:
                ax.add_patch(Rectangle((x, y), w, 0.7, facecolor=COLORS["paper"],
                                       edgecolor=COLORS["ink"], linewidth=1.0))
                for c in range(BS):
                    if b * BS + c < PROMPT:
                        ax.add_patch(Rectangle((x + 0.04 + c * 0.215, y + 0.08), 0.19, 0.54,
                                               facecolor=COLORS["memory"], edgecolor="none"))
                if b * BS >= PROMPT:
                    ax.add_patch(Rectangle((x, y), w, 0.7, facecolor="none", hatch="////",
                                           edgecolor=COLORS["waste"], linewidth=0.0))
            else:
                ax.add_patch(Rectangle((x, y), w, 0.7, facecolor="none", linestyle="--",
                                       edgecolor=COLORS["reference"], linewidth=1.0))

    ax.text(0.0, 10.3, "One request at admission: 5-token prompt, max_tokens 24, block_size 4",
            fontsize=10.5, fontweight="bold", va="top")
    blocks(8.3, 8, "Week 8")
    ax.text(x0, 7.75, "8 blocks booked for 29 tokens; 6 of them empty (hatched)",
            fontsize=9, color=COLORS["waste"], va="top")
    blocks(6.2, 2, "Day 33")
    for b in range(2, 8):
        x = x0 + b * (w + gap) + w / 2
        at = b * BS + 1
        text = f"token\n{at}" if at <= final_tokens else "never"
        ax.text(x, 5.95, text, ha="center", va="top", fontsize=8.5,
                color=COLORS["ink"] if at <= final_tokens else COLORS["waste"])
    ax.text(x0, 4.95, f"2 held; each outline is bought when the cache must hold that token;\n"
                      f"the 8th never is: token {PROMPT + BUDGET} is sampled, never cached",
            fontsize=9, va="top")

    ax.text(0.0, 3.75, "blocks_needed_for(r), the only rule:", fontsize=9.5, fontweight="bold")
    ax.text(0.0, 3.25, "blocks_for_length(target) - len(r.blocks)\n"
                       "target = worst_case_tokens (reserve) | num_tokens (incremental)",
            fontsize=9, family="monospace", va="top")

    # the state machine, with the edge Day 33 makes legal
    y = 0.1
    box(ax, 0.0, y, 2.4, 0.9, "WAITING", color="reference", fontsize=9.5)
    box(ax, 4.0, y, 2.4, 0.9, "RUNNING", color="compute", fontsize=9.5)
    box(ax, 8.0, y, 2.3, 0.9, "FINISHED", color="memory", fontsize=9.5)
    arrow(ax, (2.45, y + 0.72), (3.95, y + 0.72), COLORS["ink"])
    ax.text(3.2, y + 0.98, "admit", ha="center", fontsize=8.5)
    arrow(ax, (3.95, y + 0.2), (2.45, y + 0.2), COLORS["waste"])
    ax.text(3.2, y - 0.35, "preempt (new)", ha="center", fontsize=8.5, color=COLORS["waste"],
            fontweight="bold")
    arrow(ax, (6.45, y + 0.45), (7.95, y + 0.45), COLORS["ink"])
    ax.text(7.2, y + 0.7, "stop / length", ha="center", fontsize=8.5)


def bars(ax, rows: dict) -> None:
    width = 0.38
    for k, pool in enumerate(POOLS):
        for j, policy in enumerate(("reserve", "incremental")):
            t = rows[pool, policy]
            x = k + (j - 0.5) * width
            color = COLORS["reference"] if policy == "reserve" else COLORS["compute"]
            ax.bar(x, t["iterations"], width=width * 0.95, color=color)
            ax.text(x, t["iterations"] + 1.5, str(t["iterations"]), ha="center", va="bottom",
                    fontsize=10, fontweight="bold")
            note = f"occ\n{t['occupancy']:.3f}"
            if policy == "incremental":
                note += f"\n\n{len(t['preempted'])}\npre-\nempt."
            ax.text(x, t["iterations"] - 1.5, note, ha="center", va="top", fontsize=8,
                    color=COLORS["paper"])
    ax.set_xticks(range(len(POOLS)), [f"{p} tokens\n({p // BS} blocks)" for p in POOLS])
    ax.set_ylim(0, 108)
    ax.set_ylabel("iterations to finish all four")
    ax.set_xlabel("KV pool")
    ax.set_title("Same 96 tokens out, four slots", fontsize=11, loc="left")
    ax.legend(handles=[Patch(color=COLORS["reference"], label=NAMES["reserve"]),
                       Patch(color=COLORS["compute"], label=NAMES["incremental"])],
              loc="upper right", fontsize=9)


def allocation_figure(rows: dict) -> None:
    fig = figure(width=12, height=5.8)[0]
    fig.clf()
    fig.subplots_adjust(left=0.01, right=0.99, top=0.88, bottom=0.12)
    grid = fig.add_gridspec(1, 2, width_ratios=[1.45, 1.0], wspace=0.16)
    one_request(fig.add_subplot(grid[0, 0]))
    bars(fig.add_subplot(grid[0, 1]), rows)
    fig.suptitle("Day 33: buy blocks as tokens arrive, and preempt when the pool runs dry "
                 "(4 requests, 5-token prompts, 24 tokens each)", fontsize=12.5,
                 fontweight="bold")
    save(fig, __file__, "incremental-allocation")


def lanes(ax, t: dict, title: str, span: int) -> None:
    for i, lane in enumerate(t["lanes"]):
        y = N - 1 - i
        for it, what in lane.items():
            face = COLORS["highlight"] if what == "prefill" else COLORS["compute"]
            ax.add_patch(Rectangle((it - 1, y + 0.1), 1.0, 0.8, facecolor=face,
                                   edgecolor="none"))
        ax.text(-0.8, y + 0.5, f"r{i}", ha="right", va="center", fontsize=9)
    for it, i in t["preempted"]:
        ax.plot(it - 1, N - 1 - i + 0.5, marker="X", color=COLORS["waste"], markersize=9,
                markeredgecolor=COLORS["paper"])
    ax.set_xlim(-3, span + 1)
    ax.set_ylim(0, N)
    ax.set_yticks([])
    ax.grid(False)
    ax.spines["left"].set_visible(False)
    ax.set_title(title, fontsize=10, loc="left")


def timeline_figure(rows: dict) -> None:
    span = max(t["iterations"] for t in rows.values())
    fig, axes = figure(width=11, height=7.6, nrows=4, sharex=True)
    order = [(48, "reserve"), (48, "incremental"), (96, "reserve"), (96, "incremental")]
    for ax, (pool, policy) in zip(axes, order, strict=True):
        t = rows[pool, policy]
        n = len(t["preempted"])
        extra = (f", {n} preemption{'s' * (n != 1)}, {t['recomputed']} tokens recomputed"
                 if policy == "incremental" else "")
        lanes(ax, t, f"{pool}-token pool, {NAMES[policy]}: {t['iterations']} iterations, "
                     f"occupancy {t['occupancy']:.3f}{extra}", span)
    axes[-1].set_xlabel("iteration (one schedule() and one model step)")
    axes[-1].set_xticks([0, 11, 23, 35, 47, 59, 71, 83, 95], ["1", "12", "24", "36", "48",
                                                               "60", "72", "84", "96"])
    fig.legend(handles=[
        Patch(color=COLORS["highlight"], label="prefill (first admission, or resume)"),
        Patch(color=COLORS["compute"], label="decode"),
        Line2D([], [], marker="X", color=COLORS["waste"], linestyle="none", markersize=9,
               label="preempted here: blocks and slot back, tokens kept")],
        loc="lower center", ncols=3, fontsize=9, bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("Where the iterations go: one row per request, four slots", fontsize=12.5,
                 fontweight="bold")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save(fig, __file__, "preemption-timeline")


if __name__ == "__main__":
    measured = {(p, pol): trace(p, pol) for p in POOLS for pol in ("reserve", "incremental")}
    allocation_figure(measured)
    timeline_figure(measured)
