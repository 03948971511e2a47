"""Day 53's figures: the recorded bench, and what static waves waste of the same workload.

    python chapters/day53_bench_peers/diagram.py

writes two files into build/figures/day53_bench_peers/:

- bench.png: useful tokens/s of each engine in each recorded run (results/offline-*.json), one
  panel per model and dtype, nanoserve highlighted; the ratio nanoserve/engine on each bar.
- waves.png: the 16 requests' output budgets as rows, in arrival order, against the two static
  waves of 8 that decode each row until the wave's longest member is done (counted by the
  snapshot; nothing timed).
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day53_bench_peers.snapshot.workload import (  # noqa: E402
    make_workload,
    static_waves,
)
from diagrams import COLORS, figure, save  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RUNS = [("offline-smollm2-135m-bfloat16.json", "SmolLM2-135M shape, bf16"),
        ("offline-smollm2-135m-float32.json", "SmolLM2-135M shape, float32"),
        ("offline-tiny-float32.json", "nanoserve-tiny, float32")]
LABEL = {"nanoserve": "nanoserve", "hf": "HF\ngenerate", "hf-cb": "HF\ncontinuous",
         "vllm": "vLLM\nCPU 0.32"}


def bench(axes) -> None:
    for ax, (name, title) in zip(axes, RUNS, strict=True):
        record = json.loads((RESULTS / name).read_text())
        rows = [r for r in record["report"]["rows"] if r["status"] == "ok"]
        tps = [r["tokens_per_s"] for r in rows]
        colors = [COLORS["highlight"] if r["engine"] == "nanoserve" else COLORS["reference"]
                  for r in rows]
        bars = ax.bar([LABEL[r["engine"]] for r in rows], tps, color=colors)
        for bar, r in zip(bars, rows, strict=True):
            if r["engine"] != "nanoserve":
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                        f"{r['nanoserve_ratio']:.2f}x", ha="center", va="bottom", fontsize=9)
        ax.set_title(title, loc="left", fontsize=10.5)
        ax.tick_params(axis="x", labelsize=8.5)
    axes[0].set_ylabel("useful tokens / s (higher is better)")


def waves(ax) -> None:
    wl = make_workload(16)
    for w in static_waves(len(wl.max_tokens), 8):
        longest = max(wl.max_tokens[i] for i in w)
        for i in w:
            ax.barh(i, wl.max_tokens[i], color=COLORS["compute"], height=0.75)
            ax.barh(i, longest - wl.max_tokens[i], left=wl.max_tokens[i],
                    color=COLORS["waste"], height=0.75)
        ax.axhline(w[-1] + 0.5, color=COLORS["ink"], linewidth=0.6)
    ax.invert_yaxis()
    ax.set_xlabel("decode steps")
    ax.set_ylabel("request (arrival order)")
    ax.barh([], [], color=COLORS["compute"], label="its own tokens")
    ax.barh([], [], color=COLORS["waste"], label="waiting for the wave's longest")
    ax.legend(loc="lower right", fontsize=9)
    ax.set_title("Static waves of 8: each row runs to the wave's longest", loc="left")


if __name__ == "__main__":
    fig, axes = figure(width=12, height=3.8, ncols=3)
    bench(axes)
    save(fig, __file__, "bench")
    fig, ax = figure(width=9, height=4.5)
    waves(ax)
    save(fig, __file__, "waves")
