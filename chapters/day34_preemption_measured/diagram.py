"""Day 34's figure: who was preempted, and what the recompute cost, on the chapter's workload.

    python chapters/day34_preemption_measured/diagram.py

writes build/figures/day34_preemption_measured/recompute-bill.png. The workload is the claims'
(batchbench, 12 requests, seed 0, prompts of 4-24 tokens, 8-40 greedy tokens each with EOS
ignored, block_size 4, 8 slots, a 24-block pool against a roomy one). With EOS ignored, what the
scheduler does depends only on the lengths, so the live scheduler replays it over integer tokens
with no model and reproduces the engine's counts exactly (the claims check them on the model).
Nothing here is timed.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch  # noqa: E402

from chapters.common import SHIPPED  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve.bench.batchbench import workload  # noqa: E402
from nanoserve.engine.kv_manager import KVCacheManager  # noqa: E402
from nanoserve.engine.request import Request  # noqa: E402
from nanoserve.engine.scheduler import Scheduler  # noqa: E402

REQUESTS, SEED, PROMPTS, GENS, SLOTS, BS, CRAMPED = 12, 0, (4, 24), (8, 40), 8, 4, 24


def replay(num_blocks: int) -> dict:
    """LLM._run_continuous without the model: token positions each request makes the model
    compute, split into first computations and re-prefills on resume."""
    vocab = json.loads((SHIPPED / "config.json").read_text())["vocab_size"]
    prompts, gens = workload(REQUESTS, SEED, PROMPTS, GENS, vocab)
    sched = Scheduler(KVCacheManager(num_blocks, BS), SLOTS, allocation="incremental")
    reqs = [Request(i, p, max_tokens=g) for i, (p, g) in enumerate(zip(prompts, gens,
                                                                       strict=True))]
    for r in reqs:
        sched.add(r)
    computed, recomputed, iterations = [0] * REQUESTS, [0] * REQUESTS, 0
    while True:
        out = sched.schedule()
        if out.num_scheduled == 0:
            break
        iterations += 1
        for r in out.admitted:
            computed[r.request_id] += r.num_tokens  # a prefill over token_ids
            if r.num_preemptions:
                recomputed[r.request_id] += r.num_tokens
        for r in out.decode:
            computed[r.request_id] += 1
        for r in out.admitted + out.decode:
            r.append_token(1)
    return {"computed": computed, "recomputed": recomputed, "iterations": iterations,
            "preemptions": [r.num_preemptions for r in reqs], "total": sched.recomputed_tokens}


def main() -> None:
    cramped, roomy = replay(CRAMPED), replay(10_000)
    assert sum(cramped["recomputed"]) == cramped["total"]
    first = [c - r for c, r in zip(cramped["computed"], cramped["recomputed"], strict=True)]
    fig, (left, right) = figure(width=11, height=4.8, ncols=2,
                                gridspec_kw={"width_ratios": [2.3, 1.0], "wspace": 0.28})

    x = list(range(REQUESTS))
    left.bar(x, first, color=COLORS["compute"], width=0.7)
    left.bar(x, cramped["recomputed"], bottom=first, color=COLORS["waste"], width=0.7)
    for i, n in enumerate(cramped["preemptions"]):
        top = cramped["computed"][i]
        label = f"{n}x"
        left.text(i, top + 2, label, ha="center", va="bottom", fontsize=9.5,
                  fontweight="bold", color=COLORS["waste"] if n else COLORS["reference"])
    left.set_xticks(x, [f"r{i}" for i in x])
    left.set_xlabel("request, in arrival order (r0 is the oldest)")
    left.set_ylabel("token positions computed")
    left.set_ylim(0, max(cramped["computed"]) * 1.32)
    left.set_title(f"Per request, {CRAMPED}-block pool: preemptions above each bar",
                   fontsize=11, loc="left")
    left.legend(handles=[Patch(color=COLORS["compute"], label="first computation"),
                         Patch(color=COLORS["waste"], label="re-prefilled on resume")],
                loc="upper left", fontsize=9, ncols=2)

    c_total, r_total = sum(cramped["computed"]), sum(roomy["computed"])
    rec = cramped["total"]
    right.bar([0], [c_total - rec], color=COLORS["compute"], width=0.6)
    right.bar([0], [rec], bottom=[c_total - rec], color=COLORS["waste"], width=0.6)
    right.bar([1], [r_total], color=COLORS["compute"], width=0.6)
    right.text(0, c_total - rec / 2, f"{rec}\n({rec / c_total:.1%})", ha="center",
               va="center", color=COLORS["paper"], fontsize=10, fontweight="bold")
    right.text(0, (c_total - rec) / 2, str(c_total - rec), ha="center", va="center",
               color=COLORS["paper"], fontsize=10)
    right.text(1, r_total / 2, str(r_total), ha="center", va="center",
               color=COLORS["paper"], fontsize=10)
    for i, (t, it) in enumerate(((c_total, cramped["iterations"]),
                                 (r_total, roomy["iterations"]))):
        right.text(i, t + 10, f"{t} positions\n{it} iterations", ha="center", va="bottom",
                   fontsize=9)
    right.set_xticks([0, 1], [f"{CRAMPED} blocks\n{sum(cramped['preemptions'])} preemptions",
                              "roomy\n0 preemptions"])
    right.set_ylim(0, c_total * 1.22)
    right.set_title("The whole run", fontsize=11, loc="left")

    fig.suptitle("Day 34: the recompute bill, 12 requests (batchbench seed 0, 8 slots, "
                 "block_size 4)", fontsize=12.5, fontweight="bold")
    save(fig, __file__, "recompute-bill")


if __name__ == "__main__":
    main()
