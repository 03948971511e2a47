"""Day 4's figure: how nanoserve-tiny learned (and memorised), and the loop that makes it talk.

Left: the training loss every 50 steps (train_log.json, written by `make train-tiny`), with the
validation loss on held-out topics as a horizontal line. The gap between them is the
memorisation the chapter describes. Right: the uncached generation loop as a block diagram, with
the tensor shapes of one step.

    .venv/bin/python chapters/day04_generate/diagram.py
"""

import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch  # noqa: E402

from diagrams import COLORS, box, figure, save  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOG = ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny" / "train_log.json"


def loss_panel(ax, log: dict) -> None:
    losses = log["loss_every_50"]
    steps = [1 + 50 * i for i in range(len(losses))]  # history[::50]: steps 1, 51, 101, ...
    ax.plot(steps, losses, "o-", color=COLORS["compute"], lw=2, ms=5,
            label="training loss (one batch of 16×256)")
    ax.plot([log["steps"]], [log["final_train_loss"]], "D", color=COLORS["compute"], ms=7,
            label=f"final training loss, mean of last 50 steps: {log['final_train_loss']:.2f}")
    val = log["val_loss"]
    ax.axhline(val, color=COLORS["waste"], lw=2, ls="--")
    ax.text(log["steps"], val + 0.15, f"validation loss (held-out topics): {val:.2f}",
            ha="right", va="bottom", color=COLORS["waste"], fontsize=10, fontweight="bold")
    uniform = math.log(2048)
    ax.axhline(uniform, color=COLORS["reference"], lw=1, ls=":")
    ax.text(log["steps"], uniform + 0.15,
            f"uniform guess over 2,048 tokens: ln 2048 = {uniform:.2f}",
            ha="right", va="bottom", color=COLORS["reference"], fontsize=9)
    ax.annotate("", xy=(log["steps"] - 15, val), xytext=(log["steps"] - 15, 0.45),
                arrowprops=dict(arrowstyle="<->", color=COLORS["highlight"], lw=2))
    ax.text(log["steps"] - 30, (val + 0.45) / 2, "memorisation\ngap", ha="right", va="center",
            color=COLORS["ink"], fontsize=10)
    ax.set_xlim(-10, log["steps"] + 20)
    ax.set_ylim(0, 8.6)
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title("nanoserve-tiny: memorises its training text")
    ax.legend(loc="lower left", fontsize=9)


def arrow(ax, start, end, text=None, rad=0.0, color="ink", text_xy=None):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.5,
                                 color=COLORS[color], connectionstyle=f"arc3,rad={rad}"))
    if text:
        x, y = text_xy or ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        ax.text(x, y, text, fontsize=9, color=COLORS["ink"], ha="left", va="center")


def loop_panel(ax) -> None:
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.axis("off")
    ax.set_title("Day 4's loop: recompute everything, keep one row")
    x, w, h = 0.9, 4.8, 0.9
    rows = [  # (y, text, colour)
        (8.8, "tokenize: BOS + prompt ids", "reference"),
        (7.3, "forward over all T tokens\n(1, T) → (1, T, E)", "waste"),
        (5.8, "logits of the last position only\nh[0, -1] → (V,)", "compute"),
        (4.3, "choose the next token\n(argmax, or sample)", "compute"),
        (2.8, "append it (T → T + 1) and\ndetokenize the new text delta", "memory"),
        (1.3, "stop rules, in order", "highlight"),
    ]
    for y, text, color in rows:
        box(ax, x, y, w, h, text, color=color, fontsize=9.5,
            text_color=COLORS["ink"] if color == "highlight" else "white")
    cx = x + w / 2
    for (y0, _, _), (y1, _, _) in zip(rows, rows[1:], strict=False):
        arrow(ax, (cx, y0 - 0.02), (cx, y1 + h + 0.04))
    # the repeat edge: stop rules -> forward again, drawn as a path round the left side
    lx, y_from, y_to = x - 0.45, 1.3 + h / 2, 7.3 + h / 2
    ax.plot([x - 0.02, lx, lx], [y_from, y_from, y_to], color=COLORS["waste"], lw=1.5)
    arrow(ax, (lx, y_to), (x - 0.02, y_to), color="waste")
    ax.text(lx - 0.12, (y_from + y_to) / 2, "no rule fired: repeat with all T + 1 tokens",
            fontsize=9, color=COLORS["waste"], ha="right", va="center", rotation=90)
    # the exits of the stop rules, on the right
    rx = x + w + 0.35
    rules = ("1. EOS / stop_token_ids / stop string\n     → finish_reason \"stop\"\n"
             "2. max_tokens reached → \"length\"\n3. context full → \"length\"")
    ax.text(rx, 1.3 + h / 2, rules, fontsize=8.5, va="center", ha="left",
            color=COLORS["ink"],
            bbox=dict(boxstyle="round,pad=0.35", fc=COLORS["muted"], ec=COLORS["ink"], lw=0.8))
    arrow(ax, (x + w + 0.02, 1.3 + h / 2), (rx - 0.05, 1.3 + h / 2), color="ink")
    box(ax, rx + 0.15, 4.3, 3.6, 0.9, "return .token_ids,\n.text, .finish_reason",
        color="reference", fontsize=9)
    arrow(ax, (rx + 1.95, 1.3 + h / 2 + 0.62), (rx + 1.95, 4.24), text="a rule fired",
          color="ink", text_xy=(rx + 2.05, 3.3))


def generate_figure():
    log = json.loads(LOG.read_text())
    fig, (ax, bx) = figure(width=13, height=5.4, ncols=2,
                           gridspec_kw={"width_ratios": [1, 1.05], "wspace": 0.12})
    loss_panel(ax, log)
    loop_panel(bx)
    return fig


if __name__ == "__main__":
    save(generate_figure(), __file__, "tiny-loss-and-loop")
