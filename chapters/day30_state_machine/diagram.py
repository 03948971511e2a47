"""Day 30's figure: the request state machine, and what it buys on the Day-29 shape.

    python chapters/day30_state_machine/diagram.py

writes build/figures/day30_state_machine/state-machine.png. Left, the three states and the edges
of the Day 30 transition table, with running -> waiting drawn grey because it does not exist yet
(a running request runs to its end; preemption is a later chapter). Right, eight rows as an
iteration timeline, counted by the frozen host-only harness: a static batch above, the scheduled
loop below. Nothing is timed, no model is loaded.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from chapters.common import DAY29_MAX_TOKENS  # noqa: E402
from chapters.day30_state_machine.snapshot.harness import (  # noqa: E402
    run_scheduled,
    run_static,
)
from chapters.day30_state_machine.snapshot.request import _LEGAL_TRANSITIONS  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

ROWS = len(DAY29_MAX_TOKENS)


def arrow(ax, start, end, color, label="", label_xy=None, rad=0.0, style="-|>", dashed=False,
          fontsize=9.5, label_color=None):
    ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={rad}",
                                 arrowstyle=style, mutation_scale=16, linewidth=1.6,
                                 color=color, linestyle=(0, (4, 3)) if dashed else "-"))
    if label:
        ax.text(*label_xy, label, ha="center", va="center", fontsize=fontsize,
                color=label_color or COLORS["ink"])


def state_machine(ax) -> None:
    edges = {(a.value, b.value) for a, bs in _LEGAL_TRANSITIONS.items() for b in bs}
    assert edges == {("waiting", "running"), ("waiting", "finished"),
                     ("running", "finished")}, edges  # the figure draws exactly the table
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10.4)
    ax.axis("off")
    w, h = 3.0, 1.3
    pos = {"waiting": (0.3, 6.9), "running": (6.7, 6.9), "finished": (3.5, 1.9)}
    colors = {"waiting": "reference", "running": "compute", "finished": "memory"}
    for name, (x, y) in pos.items():
        box(ax, x, y, w, h, name.upper(), color=colors[name], fontsize=11)

    # waiting -> running: admit, gated by two resources
    arrow(ax, (3.4, 7.85), (6.6, 7.85), COLORS["ink"])
    ax.text(5.0, 8.2, "admit", ha="center", va="bottom", fontsize=10.5, fontweight="bold")
    ax.text(5.0, 9.05, "needs a free slot\nand worst-case blocks", ha="center", va="bottom",
            fontsize=9, color=COLORS["ink"])
    # running -> waiting: absent until preemption exists
    arrow(ax, (6.6, 7.15), (3.4, 7.15), COLORS["reference"], dashed=True, rad=-0.35)
    ax.text(5.0, 5.75, "preempt: not yet;\na running request\nruns to its end", ha="center",
            va="center", fontsize=9.5, color=COLORS["reference"], style="italic")
    # running -> finished
    arrow(ax, (7.9, 6.8), (6.0, 3.3), COLORS["ink"])
    ax.text(8.25, 4.7, "stop / length\n(or abort)", ha="left", va="center", fontsize=10)
    # waiting -> finished
    arrow(ax, (1.8, 6.8), (4.0, 3.3), COLORS["ink"])
    ax.text(1.65, 4.7, "abort", ha="right", va="center", fontsize=10)
    ax.text(5.0, 0.85, "every other edge, self-loops included,\nraises IllegalTransition",
            ha="center", va="center", fontsize=9.5, color=COLORS["waste"])
    ax.set_title("A request's life: _LEGAL_TRANSITIONS", fontsize=12, loc="left")


def timeline(ax, finish: list[int], handed_back: list[int], held_until: int | None,
             title: str) -> None:
    iters = max(handed_back)
    for r, (m, back) in enumerate(zip(finish, handed_back, strict=True)):
        y = ROWS - 1 - r
        for it in range(1, iters + 1):
            x = it - 1
            if it <= m:
                face = COLORS["highlight"] if it == 1 else COLORS["compute"]
                ax.add_patch(Rectangle((x, y), 0.9, 0.78, facecolor=face, edgecolor="none"))
            elif held_until is not None and it <= held_until:
                ax.add_patch(Rectangle((x, y), 0.9, 0.78, facecolor=COLORS["paper"],
                                       edgecolor=COLORS["waste"], hatch="////", linewidth=0.0))
        ax.plot([back + 0.1], [y + 0.39], marker="<", color=COLORS["ink"], markersize=6)
        ax.text(-0.6, y + 0.39, f"r{r}", ha="right", va="center", fontsize=9.5)
    ax.set_xlim(-2.2, 33.5)
    ax.set_ylim(-0.3, ROWS + 0.1)
    ticks = (1, 4, 8, 12, 16, 20, 24, 28, 32)
    ax.set_xticks([t - 0.55 for t in ticks], [str(t) for t in ticks])
    ax.set_yticks([])
    ax.tick_params(length=0)
    ax.grid(False)
    for s in ("left", "bottom"):
        ax.spines[s].set_visible(False)
    ax.set_title(title, fontsize=11, loc="left")


def main() -> None:
    static = run_static(slots=8, prompt_len=5, gen_lens=DAY29_MAX_TOKENS, requests=8)
    sched = run_scheduled(slots=8, block_size=4, pool_tokens=1024, prompt_len=5,
                          gen_lens=DAY29_MAX_TOKENS, requests=8)
    fig = figure(width=13, height=6.6)[0]
    fig.clf()
    grid = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.45], hspace=0.55, wspace=0.08)
    state_machine(fig.add_subplot(grid[:, 0]))

    top = fig.add_subplot(grid[0, 1])
    timeline(top, static["finish_iteration"], static["returned_iteration"],
             held_until=static["forward_passes"],
             title=f"static batch: {static['issued_tokens']} row-steps for "
                   f"{static['useful_tokens']} tokens, r0 handed back after "
                   f"{static['returned_iteration'][0]}")
    top.text(17.5, 3.4, "finished rows still computed", ha="center", va="center",
             fontsize=9.5, color=COLORS["waste"], fontweight="bold",
             bbox={"facecolor": COLORS["paper"], "edgecolor": "none", "pad": 2})

    bottom = fig.add_subplot(grid[1, 1])
    # scheduled: a request is handed back by the schedule() call that follows its last token
    timeline(bottom, sched["finish_iteration"], sched["finish_iteration"], held_until=None,
             title=f"scheduled: {sched['issued_tokens']} row-steps for "
                   f"{sched['useful_tokens']} tokens, r0 handed back after "
                   f"{sched['finish_iteration'][0]}")
    bottom.text(19.5, 4.4, "rows 0-6 are free from iteration 5: a waiting\nrequest would "
                "land there in that same schedule() call", ha="center", va="center",
                fontsize=9.5, color=COLORS["ink"])
    bottom.set_xlabel("iteration (one schedule() + one model step)")
    bottom.legend(handles=[
        Patch(color=COLORS["highlight"], label="prefill: the first token"),
        Patch(color=COLORS["compute"], label="decode: a wanted token"),
        Patch(facecolor=COLORS["paper"], edgecolor=COLORS["waste"], hatch="////",
              label="finished row, still in the batch"),
        bottom.plot([], [], marker="<", color=COLORS["ink"], linestyle="none",
                    label="answer handed back")[0]],
        loc="upper center", bbox_to_anchor=(0.47, -0.3), ncols=2, fontsize=9.5)
    fig.suptitle("Day 30: a request with a state leaves the batch at its own last token "
                 "(Day-29 shape, 8 slots)", fontsize=13, fontweight="bold", x=0.5, y=1.0)
    save(fig, __file__, "state-machine")


if __name__ == "__main__":
    main()
