"""Day 36's figure: the chapter's workload through one long-lived engine core, and a stop
string streamed with the hold-back.

    python chapters/day36_engine_core/diagram.py

writes build/figures/day36_engine_core/engine-core.png. It runs the frozen Day 36 snapshot core
on nanoserve-tiny (float32, greedy, EOS ignored, block_size 4, a 16-block pool, 4 slots): the
claims' 12 requests (seed 36), request i added before step 2i, r4 and r9 aborted at steps 14 and
24. The claims show the package's core gives the same deltas and counts. Nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chapters.common import SHIPPED  # noqa: E402
from chapters.day01_llama_forward.snapshot.weights import load_model  # noqa: E402
from chapters.day33_preemption.snapshot.request import RequestState  # noqa: E402
from chapters.day36_engine_core.claims import (  # noqa: E402
    ABORTS,
    CRAMPED,
    STOP,
    STOP_PROMPT,
    WORKLOAD,
)
from chapters.day36_engine_core.snapshot.core import EngineCore  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve.tokenizer import IncrementalDetokenizer, Tokenizer  # noqa: E402


def new_core(model, tok) -> EngineCore:
    return EngineCore(model, CRAMPED["num_kv_blocks"], CRAMPED["block_size"],
                      CRAMPED["max_num_seqs"],
                      detokenizer=lambda ids: IncrementalDetokenizer(tok, ids))


@torch.inference_mode()
def trace(core: EngineCore) -> dict:
    """The drive loop of the claims, recording every step: who got a delta, who waited, who
    was preempted or aborted, and the blocks held."""
    n, reqs = len(WORKLOAD), {}
    lanes = {f"r{i}": [] for i in range(n)}  # (step, "delta" | "wait")
    marks = {"added": [], "preempted": [], "aborted": [], "finished": []}
    held, i = [], 0
    while i < n or core.has_unfinished():
        step = len(held)
        while i < n and step >= 2 * i:
            reqs[f"r{i}"] = core.add_request(f"r{i}", *WORKLOAD[i])
            marks["added"].append((step, f"r{i}"))
            i += 1
        if step in ABORTS and core.abort_request(ABORTS[step]):
            marks["aborted"].append((step, ABORTS[step]))
        preempted = {k: r.num_preemptions for k, r in reqs.items()}
        got = {d.request_id: d for d in core.step()}
        for k, r in reqs.items():
            if k in got and got[k].new_token_ids:
                lanes[k].append((step, "delta"))
            elif r.state is RequestState.WAITING:
                lanes[k].append((step, "wait"))
            if r.num_preemptions > preempted[k]:
                marks["preempted"].append((step, k))
            if k in got and got[k].finished and got[k].finish_reason != "abort":
                marks["finished"].append((step, k))
        held.append(core.pool.num_held)
    core.check_drained()
    return {"lanes": lanes, "marks": marks, "held": held}


@torch.inference_mode()
def hold_back(core: EngineCore, tok: Tokenizer) -> tuple[list[int], list[int], int]:
    """Characters decoded and characters streamed after each step, for the stop request."""
    r = core.add_request("stop", tok.encode(STOP_PROMPT), 30, (STOP,))
    decoded, streamed, shown = [], [], 0
    while core.has_unfinished():
        shown += sum(len(d.new_text) for d in core.step())
        if not r.is_finished:
            decoded.append(len(r.detokenizer.text))
            streamed.append(shown)
    streamed.append(shown)  # the finished delta releases what was held, up to the cut
    assert shown == len(r.text)
    return decoded, streamed, len(r.text)


def main() -> None:
    torch.set_num_threads(1)
    model, tok = load_model(SHIPPED), Tokenizer.from_dir(SHIPPED)
    t = trace(new_core(model, tok))
    decoded, streamed, final = hold_back(new_core(model, tok), tok)
    steps = len(t["held"])

    fig = figure(width=12, height=8.4)[0]
    fig.clf()
    grid = fig.add_gridspec(2, 2, height_ratios=[2.2, 1.0], width_ratios=[1.6, 1.0],
                            hspace=0.32, wspace=0.22)
    lanes_ax = fig.add_subplot(grid[0, :])
    pool_ax = fig.add_subplot(grid[1, 0], sharex=lanes_ax)
    text_ax = fig.add_subplot(grid[1, 1])
    n = len(WORKLOAD)
    row = {f"r{i}": n - 1 - i for i in range(n)}
    for k, lane in t["lanes"].items():
        for kind, color in (("wait", COLORS["muted"]), ("delta", COLORS["compute"])):
            spans = [(s - 0.5, 1) for s, what in lane if what == kind]
            lanes_ax.broken_barh(spans, (row[k] + 0.15, 0.7), facecolors=color)
    style = {"added": ("|", COLORS["ink"], 12), "preempted": ("X", COLORS["waste"], 8),
             "aborted": ("D", COLORS["ink"], 6), "finished": ("o", COLORS["memory"], 6)}
    for name, points in t["marks"].items():
        marker, color, size = style[name]
        x = [s - 0.5 if name == "added" else s for s, _ in points]
        lanes_ax.plot(x, [row[k] + 0.5 for _, k in points], linestyle="none", marker=marker,
                      color=color, markersize=size, markeredgewidth=1.6 if name == "added"
                      else 0.6, markeredgecolor=color if name == "added" else COLORS["paper"])
    lanes_ax.set_yticks([row[f"r{i}"] + 0.5 for i in range(n)], [f"r{i}" for i in range(n)])
    lanes_ax.set_ylim(0, n)
    lanes_ax.grid(axis="y", visible=False)
    lanes_ax.set_ylabel("request (added before step 2i)")
    lanes_ax.set_title(f"One core, {n} requests arriving while others run: "
                       f"{len(t['marks']['preempted'])} preemptions, "
                       f"{len(t['marks']['aborted'])} aborts, {steps} steps",
                       fontsize=11.5, loc="left")
    lanes_ax.legend(handles=[
        Patch(color=COLORS["compute"], label="a delta with a new token"),
        Patch(color=COLORS["muted"], label="waiting (queued or preempted)"),
        Line2D([], [], marker="|", color=COLORS["ink"], linestyle="none", markersize=10,
               markeredgewidth=1.6, label="add_request"),
        Line2D([], [], marker="X", color=COLORS["waste"], linestyle="none", markersize=8,
               label="preempted"),
        Line2D([], [], marker="D", color=COLORS["ink"], linestyle="none", markersize=6,
               label="abort_request"),
        Line2D([], [], marker="o", color=COLORS["memory"], linestyle="none", markersize=6,
               label="the one finished delta")],
        loc="upper right", fontsize=8.5, ncols=3, frameon=True, framealpha=0.92)

    pool_ax.step(range(steps), t["held"], where="mid", color=COLORS["memory"], linewidth=1.4,
                 label="blocks held after the step")
    pool_ax.axhline(CRAMPED["num_kv_blocks"], color=COLORS["reference"], linestyle="--",
                    linewidth=0.9, label=f"the pool: {CRAMPED['num_kv_blocks']} blocks")
    pool_ax.set_ylim(0, CRAMPED["num_kv_blocks"] + 6)
    pool_ax.set_xlim(-1, steps)
    pool_ax.set_xlabel("step (one call of core.step())")
    pool_ax.set_ylabel("KV blocks")
    pool_ax.legend(loc="upper left", fontsize=8.5, ncols=2)
    pool_ax.set_title(f"Blocks: {t['held'][-1]} held after the drain", fontsize=11,
                      loc="left")

    x = range(1, len(decoded) + 1)
    text_ax.plot(x, decoded, color=COLORS["reference"], marker=".", linewidth=1.2,
                 label="decoded so far (a stream without hold-back)")
    text_ax.plot(range(1, len(streamed) + 1), streamed, color=COLORS["compute"], marker=".",
                 linewidth=1.6, label="streamed so far (joined deltas)")
    text_ax.axhline(final, color=COLORS["waste"], linestyle="--", linewidth=1.0,
                    label=f"final text: {final} chars (cut before {STOP!r})")
    text_ax.fill_between(x, streamed[:len(decoded)], decoded, color=COLORS["highlight"], alpha=0.25,
                         label=f"held back: len({STOP!r}) - 1 = {len(STOP) - 1}")
    text_ax.set_xlabel("step of the stop-string request")
    text_ax.set_ylabel("characters")
    text_ax.legend(loc="upper left", fontsize=7.5)
    text_ax.set_ylim(0, final * 1.9)
    text_ax.set_xticks(range(1, len(streamed) + 1, 3))
    text_ax.set_title("A stop string: never streamed, then taken back", fontsize=11,
                      loc="left")

    fig.suptitle("Day 36: the engine core (nanoserve-tiny fp32, greedy, block_size 4, 16 blocks,"
                 " 4 slots, 2-core CPU)", fontsize=12.5, fontweight="bold", y=0.97)
    save(fig, __file__, "engine-core")


if __name__ == "__main__":
    main()
