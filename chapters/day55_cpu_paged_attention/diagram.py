"""Day 55's figure: how the C++ kernel cuts one decode read into tasks, what a task's online
softmax does tile by tile, and what each read materialises.

    python chapters/day55_cpu_paged_attention/diagram.py

writes build/figures/day55_cpu_paged_attention/cpu-kernel.png. Left: one row of 2,000 tokens
over 3 KV heads (SmolLM2-135M's), the task grid the frozen ``task_grid`` gives (KV heads x
splits of 512 tokens), each task leaving (m, l, acc), and one combine per KV head. Middle: one
task's 512 tokens of random scores (a tile of strong keys planted at tokens 300 to 315): the
running max after each 16-token tile, and the factor exp(m_old - m_new) by which the sum and the
accumulator are rescaled when a tile raises it. Right: one layer's decode-read workspace for 8
ragged rows (2,000 down to 10 tokens, bf16, 16-token blocks), from Day 50's frozen
``workspace_bytes`` for the rectangle and the gathered read and this day's for the kernel.
Arithmetic and counting only; nothing is timed.
"""

import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.day50_gathered_mapping.snapshot.attention import (  # noqa: E402
    workspace_bytes as day50_bytes,
)
from chapters.day55_cpu_paged_attention.snapshot.paged_decode import (  # noqa: E402
    K_SPLIT,
    K_TILE,
    task_grid,
    workspace_bytes,
)
from diagrams import COLORS, box, figure, save  # noqa: E402

HEADS = (9, 3, 64)  # SmolLM2-135M: query heads, KV heads, head_dim
RAGGED = [2000, 1500, 900, 600, 300, 128, 50, 10]


def tasks_panel(ax) -> None:
    rows, hkv, splits = task_grid(1, HEADS[1], [2000])
    for h in range(hkv):
        y = hkv - 1 - h
        for s in range(splits):
            lo, hi = s * K_SPLIT, min(2000, (s + 1) * K_SPLIT)
            box(ax, s * 1.1, y * 1.0, 1.0, 0.8, f"head {h}\n{lo}..{hi - 1}", "compute",
                fontsize=8)
        box(ax, splits * 1.1 + 0.35, y * 1.0, 1.05, 0.8, "combine\n(G = 3)", "highlight",
            fontsize=8, text_color=COLORS["ink"])
        ax.annotate("", xy=(splits * 1.1 + 0.33, y + 0.4), xytext=(splits * 1.1 - 0.1, y + 0.4),
                    arrowprops=dict(arrowstyle="->", color=COLORS["ink"]))
    ax.set_xlim(-0.1, splits * 1.1 + 1.5)
    ax.set_ylim(-0.6, hkv + 0.2)
    ax.axis("off")
    ax.text(0, -0.45, f"{rows} row × {hkv} KV heads × {splits} splits = "
            f"{rows * hkv * splits} tasks; each leaves m, l (G) and acc (G × D)",
            fontsize=8.5)
    ax.set_title("One 2,000-token row: tasks of 512 tokens", fontsize=11, loc="left")


def online_panel(ax) -> None:
    g = torch.Generator().manual_seed(55)
    s = torch.randn(K_SPLIT, generator=g, dtype=torch.float64) * 1.5
    s[300:316] += 2.5  # a tile of strong keys, to show a rescale
    m, maxima, alphas = -math.inf, [], []
    for t in range(0, K_SPLIT, K_TILE):
        mx = max(m, s[t:t + K_TILE].max().item())
        alphas.append(math.exp(m - mx) if m > -math.inf else 0.0)
        maxima.append(mx)
        m = mx
    x = list(range(0, K_SPLIT, K_TILE))  # each tile's first token
    ax.plot(range(K_SPLIT), s.tolist(), ".", markersize=1.5, color=COLORS["reference"],
            label="scores")
    ax.step(x + [K_SPLIT], maxima + maxima[-1:], where="post", color=COLORS["compute"],
            linewidth=2, label="running max m")
    ax.set_xlabel(f"token of the task ({K_TILE}-token tiles)")
    ax.set_ylabel("score")
    twin = ax.twinx()
    rescaled = [(xi, a) for xi, a in zip(x, alphas, strict=True) if 0 < a < 1]
    twin.bar([xi + K_TILE / 2 for xi, _ in rescaled], [a for _, a in rescaled], width=K_TILE,
             color=COLORS["highlight"], alpha=0.8, label="rescale exp(m_old - m_new)")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("rescale factor (< 1 when m rises)")
    twin.grid(False)
    lines = ax.get_legend_handles_labels()
    bars = twin.get_legend_handles_labels()
    ax.set_ylim(-6, 10)
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], loc="upper center", fontsize=8, ncol=3,
              markerscale=4)
    ax.set_title("Online softmax: rescale only when the max rises", fontsize=11, loc="left")


def workspace_panel(ax) -> None:
    names = ["reference\n(Day 28)", "gathered\n(Day 50)", "this kernel"]
    got = [day50_bytes("reference", RAGGED, *HEADS, 2), day50_bytes("gathered", RAGGED, *HEADS, 2),
           workspace_bytes(RAGGED, *HEADS, 16)]
    colors = [COLORS["reference"], COLORS["waste"], COLORS["memory"]]
    ax.bar(names, got, color=colors)
    for i, b in enumerate(got):
        ax.text(i, b * 1.25, f"{b:,}", ha="center", fontsize=8.5)
    ax.set_yscale("log")
    ax.set_ylim(1e4, 1e8)
    ax.set_ylabel("bytes one layer's read materialises")
    ax.set_title("8 ragged rows, bf16: workspace", fontsize=11, loc="left")


def main() -> None:
    fig, (left, mid, right) = figure(width=15, height=4.6, ncols=3,
                                     gridspec_kw={"width_ratios": [1.25, 1.3, 0.9]})
    tasks_panel(left)
    online_panel(mid)
    workspace_panel(right)
    fig.suptitle("The CPU paged-attention kernel: tasks, an online softmax, no gathered copy",
                 fontsize=12.5, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "cpu-kernel")


if __name__ == "__main__":
    main()
