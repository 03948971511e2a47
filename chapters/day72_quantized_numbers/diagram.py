"""Day 72's figures: one group on the 4-bit grid, the bytes a decode token reads, and the error
against the group size.

    python chapters/day72_quantized_numbers/diagram.py

writes into build/figures/day72_quantized_numbers/:

- ``grid.png``: the first 32 weights of row 0 of nanoserve-tiny's layer-0 ``q_proj`` (one group
  of 32), each drawn at its value, with the levels of the symmetric 4-bit grid (scale largest
  magnitude / 7.5) on the left and the asymmetric grid (the group's own range, a zero point) on
  the right, each weight joined to the level it rounds to;
- ``bytes.png``: SmolLM2-135M's weight bytes per decode token in bf16, w8a16 and w4a16 (group
  32), linears and the bf16 head stacked, each bar labelled with its byte ceiling;
- ``group-error.png``: the relative squared error of the 24 layers of 256 inputs, 4-bit,
  symmetric and asymmetric, against the group size.

Everything is computed from the weights and the shape; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.day72_quantized_numbers.claims import (  # noqa: E402
    GROUPS,
    decode_bytes,
    relative_mse,
    smollm2_bf16_rest,
    weights,
)
from chapters.day72_quantized_numbers.snapshot.grid import quantize_group  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def draw_grid(ax, w: torch.Tensor, symmetric: bool) -> None:
    g = w.double()[None]
    deq, scale = quantize_group(g, 4, symmetric=symmetric)
    s = scale.item()
    if symmetric:
        levels = [q * s for q in range(-8, 8)]
    else:
        lo = min(g.min().item(), 0.0)
        zero = -8 - round(lo / s)
        levels = [(q - zero) * s for q in range(-8, 8)]
    for v in levels:
        ax.axhline(v, color=COLORS["muted"], lw=1.2, zorder=0)
    ax.axhline(0, color=COLORS["reference"], lw=0.8, ls="--", zorder=0)
    x = range(g.shape[1])
    for i, (a, b) in enumerate(zip(g[0].tolist(), deq[0].tolist(), strict=True)):
        ax.plot([i, i], [a, b], color=COLORS["waste"], lw=1)
    ax.scatter(x, deq[0], color=COLORS["compute"], s=16, zorder=3, label="level it rounds to")
    ax.scatter(x, g[0], color=COLORS["highlight"], s=16, zorder=4, label="weight")
    kind = "symmetric: max|w| / 7.5" if symmetric else "asymmetric: (max - min) / 15, zero point"
    ax.set_title(f"{kind}\nstep {s:.4f}, 16 levels", fontsize=10, loc="left")
    ax.set_xlabel("weight in the group")
    ax.legend(fontsize=8, loc="lower right")


def draw_bytes(ax) -> None:
    names = ["bf16", "w8a16 group 32", "w4a16 group 32"]
    head = smollm2_bf16_rest() / 1e6
    linear = [decode_bytes(n) / 1e6 - head for n in names]
    ax.bar(names, linear, color=COLORS["compute"], label="linear layers")
    ax.bar(names, [head] * 3, bottom=linear, color=COLORS["reference"],
           label="head (tied embedding) and norms, bf16")
    for i, n in enumerate(names):
        total = decode_bytes(n) / 1e6
        ceiling = decode_bytes("bf16") / decode_bytes(n)
        ax.text(i, total + 4, f"{total:.1f} MB\nceiling {ceiling:.2f}x", ha="center", fontsize=9)
    ax.set_ylabel("MB of weights per decode token")
    ax.set_ylim(0, decode_bytes("bf16") / 1e6 * 1.2)
    ax.legend(fontsize=8.5, loc="upper right")
    ax.set_title("SmolLM2-135M: what one decode token reads", fontsize=11, loc="left")


def draw_error(ax) -> None:
    labels = [str(g) if g else "per channel" for g in GROUPS]
    for sym, color in ((True, COLORS["compute"]), (False, COLORS["memory"])):
        ys = [100 * relative_mse(4, g, sym) for g in GROUPS]
        ax.plot(labels, ys, marker="o", color=color,
                label="symmetric" if sym else "asymmetric (zero point)")
    ax.set_xlabel("group size (inputs per scale)")
    ax.set_ylabel("squared error / squared weights, %")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    ax.set_title("nanoserve-tiny, 4-bit round-to-nearest", fontsize=11, loc="left")


if __name__ == "__main__":
    group = weights()["model.layers.0.self_attn.q_proj"][0, :32]
    fig, axes = figure(width=10, height=4, ncols=2, sharey=True)
    draw_grid(axes[0], group, True)
    draw_grid(axes[1], group, False)
    axes[0].set_ylabel("value")
    fig.tight_layout()
    save(fig, __file__, "grid")

    fig, ax = figure(width=7, height=4.2)
    draw_bytes(ax)
    fig.tight_layout()
    save(fig, __file__, "bytes")

    fig, ax = figure(width=7, height=4)
    draw_error(ax)
    fig.tight_layout()
    save(fig, __file__, "group-error")
