"""Day 75's figure: decode speed against the bytes a step reads, from the recorded bench.

    python chapters/day75_bytes_buy/diagram.py

writes ``build/figures/day75_bytes_buy/roofline.png``: for each engine (nanoserve, llama.cpp)
and the recorded run's first thread count, its bf16, w8a16 and w4a16 arms as points at (MB a
decode step reads, decode tokens/s), SmolLM2-135M shape, one request; and through each engine's
bf16 point the curve a purely memory-bound step would follow (tokens/s times bytes constant),
which meets each quantized byte count at that engine's byte ceiling. Nothing is timed here: the
points come from ``results/quant-smollm2-135m.json``.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from diagrams import COLORS, figure, save  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ENGINES = {"nanoserve": ("nanoserve", COLORS["compute"], -12),
           "llamacpp": ("llama.cpp", COLORS["highlight"], 6)}
GGUF = {"bf16": "BF16", "w8a16": "Q8_0", "w4a16": "Q4_0"}


def draw(ax, report: dict) -> None:
    t = report["threads"][0]
    sb = report["step_bytes"]
    mb = {k: v["total"] / 1e6 for k, v in sb.items()}
    lo, hi = min(mb.values()) * 0.85, max(mb.values()) * 1.05
    for engine, (name, color, dy) in ENGINES.items():
        rows = {r["weights"]: r for r in report["rows"]
                if r["engine"] == engine and r["threads"] == t and r.get("decode_tokens_per_s")}
        if "bf16" not in rows:
            continue
        k = rows["bf16"]["decode_tokens_per_s"] * mb["bf16"]  # tokens/s x MB, memory-bound
        xs = [lo + (hi - lo) * i / 100 for i in range(101)]
        ax.plot(xs, [k / x for x in xs], color=color, lw=1, ls="--", alpha=0.8,
                label=f"{name}: bytes alone (from its bf16)")
        for w, r in rows.items():
            ax.scatter(mb[w], r["decode_tokens_per_s"], color=color, s=40, zorder=3)
            label = GGUF[w] if engine == "llamacpp" else w
            ax.annotate(f"{name} {label}", (mb[w], r["decode_tokens_per_s"]),
                        textcoords="offset points", xytext=(6, dy), fontsize=8)
    ax.set_xlabel("MB of weights one decode step reads")
    ax.set_ylabel("decode tokens/s")
    threads = f"{t} thread{'s' if t > 1 else ''}"
    ax.set_title(f"SmolLM2-135M shape, one request, {threads}, bf16 activations",
                 fontsize=10, loc="left")
    ax.legend(fontsize=8, loc="upper right")


if __name__ == "__main__":
    report = json.loads((HERE / "results" / "quant-smollm2-135m.json").read_text())
    fig, ax = figure(width=8, height=4.5)
    draw(ax, report)
    save(fig, __file__, "roofline")
