"""Day 66's figures: what a tensor-parallel decode step moves, and what it cost on this machine.

    python chapters/day66_tp_cost/diagram.py

writes two files into build/figures/day66_tp_cost/:

- bytes-per-step.png: the frozen cost model's bytes per decode step at -tp 2 against the number
  of rows, for nanoserve-tiny (float32) and SmolLM2-135M's shape (float32 and bfloat16), with
  the all-reduces and the gather drawn separately and the header broadcast as a flat line.
- recorded.png: from results/tp-smollm2-135m-*.json, useful tokens per second of the two arms
  (1 rank x 2 threads, 2 ranks x 1 thread) in each dtype with their ratio, and the share of
  rank 0's decode step spent inside collectives.

No model is loaded and nothing is timed: the first figure is arithmetic on config shapes, the
second reads what `nanoserve bench tp` recorded.
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from matplotlib.patches import Patch  # noqa: E402

from chapters.day66_tp_cost.snapshot.cost import HEADER_BYTES, step_bytes  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402
from nanoserve.bench.shapes import shape_config  # noqa: E402


def _shape(cfg: dict) -> tuple[int, int, int]:
    return cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]


# (layers, hidden, vocabulary): the shipped model's config.json and SmolLM2-135M's published one
SHAPES = {"nanoserve-tiny": _shape(shape_config("tiny")),
          "SmolLM2-135M": _shape(shape_config("smollm2-135m"))}
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TP = 2


def bytes_figure() -> None:
    fig, axes = figure(width=12, height=4.8, ncols=2, sharey=True)
    lines = (("float32", 4, "-"), ("bfloat16", 2, ":"))
    for ax, (name, (layers, hidden, vocab)) in zip(axes, SHAPES.items(), strict=True):
        for dtype, size, style in lines:
            if name == "nanoserve-tiny" and dtype == "bfloat16":
                continue  # the shipped model is float32
            b = [step_bytes(layers, hidden, vocab, r, TP, size) for r in ROWS]
            ax.plot(ROWS, [x["all_reduce"] for x in b], style, marker="o", markersize=4,
                    color=COLORS["compute"],
                    label=f"all-reduce, {dtype} ({2 * layers + 1} calls)")
        gather = [step_bytes(layers, hidden, vocab, r, TP, 4)["gather"] for r in ROWS]
        ax.plot(ROWS, gather, "-", marker="s", markersize=4, color=COLORS["highlight"],
                label="gather of float32 logits (1 call)")
        ax.plot(ROWS, [HEADER_BYTES] * len(ROWS), "--", color=COLORS["reference"],
                label=f"header broadcast ({HEADER_BYTES:,} B)")
        eight = step_bytes(layers, hidden, vocab, 8, TP, 4)
        ax.axvline(8, color=COLORS["muted"], linewidth=6, zorder=0)
        ax.annotate(f"8 rows, float32:\nall-reduce {eight['all_reduce']:,} B\n"
                    f"gather {eight['gather']:,} B", (8, eight["all_reduce"]),
                    xytext=(28, 1.2e4), fontsize=8.5, color=COLORS["ink"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ROWS, [str(r) for r in ROWS])
        ax.set_xlabel("rows in the decode step (one new token each)")
        ax.set_title(f"{name}: {layers} layers, hidden {hidden}, vocabulary {vocab}",
                     fontsize=10.5, loc="left")
        ax.legend(fontsize=8.5, loc="upper left")
    axes[0].set_ylabel("bytes per decode step (input tensors)")
    fig.suptitle("What one decode step hands to the collectives at -tp 2 (cost model; the same "
                 "at any context length)", fontsize=12, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "bytes-per-step")


def recorded_figure() -> None:
    runs = {}
    for dtype in ("float32", "bfloat16"):
        runs[dtype] = json.loads((HERE / "results" / f"tp-smollm2-135m-{dtype}.json").read_text())
    fig, (left, right) = figure(width=12, height=4.6, ncols=2,
                                gridspec_kw={"width_ratios": [3, 2]})
    width = 0.38
    for k, data in enumerate(runs.values()):
        v = data["values"]
        bars = [(v["tokens_per_s_one_rank"], COLORS["reference"]),
                (v["tokens_per_s_ranks"], COLORS["compute"])]
        for j, (tps, color) in enumerate(bars):
            x = k + (j - 0.5) * width
            left.bar(x, tps, width=width * 0.95, color=color)
            left.text(x, tps + 2, f"{tps:.1f}", ha="center", va="bottom", fontsize=9)
        top = max(t for t, _ in bars)
        left.text(k, top + 16, f"ratio {v['ratio']:.2f}x", ha="center", fontsize=10,
                  fontweight="bold", color=COLORS["waste"])
        share = v["comm_share"]
        right.bar(k, v["step_ms"], width=0.55, color=COLORS["compute"],
                  label="rest of the step" if k == 0 else None)
        right.bar(k, v["comm_ms"], width=0.55, color=COLORS["waste"],
                  label="inside collectives (waits included)" if k == 0 else None)
        right.text(k, v["step_ms"] + 2, f"{v['comm_ms']:.1f} of {v['step_ms']:.1f} ms\n"
                   f"{share:.0%}", ha="center", va="bottom", fontsize=9)
    arms = runs["float32"]["values"]["arms"]
    left.set_xticks(range(len(runs)), list(runs))
    left.set_ylim(0, max(d["values"]["tokens_per_s_one_rank"] for d in runs.values()) * 1.3)
    left.set_ylabel("useful tokens per second")
    left.legend(handles=[Patch(color=COLORS["reference"], label=arms[0]),
                         Patch(color=COLORS["compute"], label=arms[1])],
                loc="upper left", fontsize=9)
    left.set_title("Throughput, 16 requests, batch 8, best of 2 rounds", fontsize=10.5,
                   loc="left")
    right.set_xticks(range(len(runs)), list(runs))
    right.set_ylim(0, max(d["values"]["step_ms"] for d in runs.values()) * 1.35)
    right.set_ylabel("rank 0's decode step, ms (8 rows)")
    right.legend(loc="upper right", fontsize=8.5)
    right.set_title("Where rank 0's step goes, 2 ranks x 1 thread", fontsize=10.5, loc="left")
    machine = runs["float32"]["machine"]
    fig.suptitle(f"SmolLM2-135M shape, random weights, gloo over 127.0.0.1 on {machine} "
                 f"({runs['float32']['date']})", fontsize=11.5, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "recorded")


if __name__ == "__main__":
    bytes_figure()
    recorded_figure()
