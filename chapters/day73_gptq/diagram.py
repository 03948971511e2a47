"""Day 73's figures: the worked example's error landscape, and each layer's output error under
round-to-nearest and GPTQ.

    python chapters/day73_gptq/diagram.py

writes into build/figures/day73_gptq/:

- ``worked.png``: the squared output error ``d H d^T`` of the worked example (two inputs of
  correlation 0.9, weights 0.4 and 0.4) over the plane of the two rounded values, as contours;
  the four points of the integer grid; round-to-nearest's choice, and GPTQ's path (round the
  first weight, move the second to 0.76, round it);
- ``layers.png``: the relative output error of nanoserve-tiny's 12 quantized linears, w4a16
  group 32, round-to-nearest beside GPTQ, on the calibration inputs GPTQ saw (the chapter's
  reduced run: 16 windows of 256 tokens of the first half of the training topics).

The second runs GPTQ once (a few seconds); nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.day73_gptq.claims import folder  # noqa: E402
from chapters.day73_gptq.snapshot.obq import gptq_columns, output_error  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def draw_worked(ax) -> None:
    H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
    w = torch.tensor([[0.4, 0.4]], dtype=torch.float64)
    q, seen = gptq_columns(w, H, 1.0)
    a = torch.linspace(-0.6, 1.6, 221, dtype=torch.float64)
    A, B = torch.meshgrid(a, a, indexing="xy")
    d1, d2 = 0.4 - A, 0.4 - B
    err = H[0, 0] * d1 ** 2 + 2 * H[0, 1] * d1 * d2 + H[1, 1] * d2 ** 2
    cs = ax.contour(A, B, err, levels=[0.088, 0.3, 0.608, 1.0, 1.368, 2.0],
                    colors=COLORS["reference"], linewidths=0.8)
    ax.clabel(cs, fontsize=7, fmt="%.3g")
    for x in (0.0, 1.0):
        for y in (0.0, 1.0):
            e = output_error(w - torch.tensor([[x, y]], dtype=torch.float64), H)
            ax.scatter([x], [y], color=COLORS["ink"], s=30, zorder=3)
            ax.annotate(f"{e:.3f}", (x, y), textcoords="offset points", xytext=(6, -12),
                        fontsize=8)
    ax.scatter([0.4], [0.4], color=COLORS["highlight"], s=60, zorder=4, label="the weights")
    ax.annotate("", xy=(0, 0), xytext=(0.4, 0.4),
                arrowprops={"arrowstyle": "->", "color": COLORS["waste"], "lw": 1.5})
    moved = seen[0, 1].item()
    path = [(0.4, 0.4), (0.0, moved), tuple(q[0].tolist())]
    for (x0, y0), (x1, y1) in zip(path, path[1:], strict=False):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": COLORS["compute"], "lw": 1.5})
    ax.plot([], [], color=COLORS["waste"], label="round-to-nearest")
    ax.plot([], [], color=COLORS["compute"], label="GPTQ: round the first, move the second")
    ax.set_xlabel("first weight")
    ax.set_ylabel("second weight")
    ax.set_aspect("equal")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("squared output error, inputs of correlation 0.9", fontsize=10, loc="left")


def draw_layers(ax) -> None:
    errors = folder("w4a16 GPTQ group 32")[2]
    names = [n.removeprefix("layers.").replace(".self_attn", "").replace(".mlp", "")
             for n in errors]
    x = torch.arange(len(names)).float()
    ax.bar(x - 0.2, [100 * e["rtn"] for e in errors.values()], 0.4, color=COLORS["reference"],
           label="round-to-nearest")
    ax.bar(x + 0.2, [100 * e["gptq"] for e in errors.values()], 0.4, color=COLORS["compute"],
           label="GPTQ")
    ax.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("output error / output, %")
    ax.legend(fontsize=9)
    ax.set_title("nanoserve-tiny, w4a16 group 32: each quantized linear's output error",
                 fontsize=10, loc="left")


if __name__ == "__main__":
    fig, ax = figure(width=6, height=5.6)
    draw_worked(ax)
    fig.tight_layout()
    save(fig, __file__, "worked")

    fig, ax = figure(width=8, height=4)
    draw_layers(ax)
    fig.tight_layout()
    save(fig, __file__, "layers")
