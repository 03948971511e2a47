"""Day 35's figure: the stress run as a timeline of rows, preemptions and aborts.

    python chapters/day35_stress/diagram.py

writes build/figures/day35_stress/stress-timeline.png. The run is the claims' (40 requests,
seed 7, prompts of 2-20 tokens, 1-40 tokens each, block_size 4, 8 slots, a 16-block pool, a 5%
chance per iteration of aborting a random live request), replayed host-only: the live scheduler
over integer tokens, with the stress test's abort rule and random stream, and no model. With EOS
ignored the schedule depends only on lengths, so the replay reproduces the run's counts exactly
(the assertion below checks the ones the chapter states). Nothing is timed.
"""

import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chapters.common import SHIPPED  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve.bench.batchbench import workload  # noqa: E402
from nanoserve.block_allocator import BlockAllocator  # noqa: E402
from nanoserve.request import Request, RequestState  # noqa: E402
from nanoserve.scheduler import Scheduler  # noqa: E402

REQUESTS, SEED, BLOCKS, BS, SLOTS, ABORT = 40, 7, 16, 4, 8, 0.05


def replay() -> dict:
    """run_stress's cramped half, host-only: same workload, same abort stream, same loop."""
    vocab = json.loads((SHIPPED / "config.json").read_text())["vocab_size"]
    prompts, gens = workload(REQUESTS, SEED, (2, 20), (1, 40), vocab)
    sched = Scheduler(BlockAllocator(BLOCKS, BS), SLOTS, allocation="incremental")
    reqs = [Request(i, p, max_tokens=g) for i, (p, g) in enumerate(zip(prompts, gens,
                                                                       strict=True))]
    for r in reqs:
        sched.add(r)
    rng = random.Random(SEED + 1)
    lanes = [[] for _ in reqs]  # (iteration, "prefill" | "decode")
    preempted, aborted, rows, held = [], [], [], []
    it = checks = 0
    while True:
        sched.check_invariants()
        checks += 1
        live = [r for r in reqs if r.state is not RequestState.FINISHED]
        if live and rng.random() < ABORT:
            victim = rng.choice(live)
            sched.abort(victim)
            aborted.append((it + 1, victim.request_id))
        out = sched.schedule()
        if out.num_scheduled == 0:
            break
        it += 1
        preempted += [(it, r.request_id) for r in out.preempted]
        for r in out.admitted:
            lanes[r.request_id].append((it, "prefill"))
        for r in out.decode:
            lanes[r.request_id].append((it, "decode"))
        rows.append(out.num_scheduled)
        held.append(sched.allocator.num_held)
        for r in out.admitted + out.decode:
            r.append_token(1)
    assert (len(preempted), sched.recomputed_tokens, len(aborted), checks) == (32, 646, 13, 351)
    return {"lanes": lanes, "preempted": preempted, "aborted": aborted, "rows": rows,
            "held": held, "iterations": it}


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
    for it, i in t["preempted"]:
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
