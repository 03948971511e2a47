"""Day 52's figure: how dtype="auto" decides, and what stays float32 in a bf16 model.

    python chapters/day52_bf16_cpu/diagram.py

writes build/figures/day52_bf16_cpu/dtype-auto.png. Left: the decision, with the outcome of each
branch asked of the frozen rule (``snapshot/dtype.py``) for an example processor. Right: one
bf16 forward and decode step, the float32 islands marked. Nothing is timed, no model is loaded.
"""

import pathlib
import sys
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch  # noqa: E402

from chapters.day52_bf16_cpu.snapshot.dtype import reason, resolve_dtype  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402


def arrow(ax, a, b, label=""):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, linewidth=1.1,
                                 color=COLORS["ink"]))
    if label:
        ax.text((a[0] + b[0]) / 2 + 0.1, (a[1] + b[1]) / 2 + 0.12, label, fontsize=8.5,
                va="bottom", color=COLORS["ink"])


def name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def decision(ax) -> None:
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 7.4)
    ax.axis("off")
    box(ax, 0.3, 6.2, 3.4, 0.8, 'dtype="auto"', "muted", fontsize=10, text_color=COLORS["ink"])
    box(ax, 0.3, 4.5, 3.4, 0.9, "on a card?", "reference", fontsize=10)
    box(ax, 0.3, 2.3, 3.4, 1.2, "/proc/cpuinfo flags:\namx_bf16 or avx512_bf16?", "reference",
        fontsize=9.5)
    arrow(ax, (2.0, 6.2), (2.0, 5.4))
    arrow(ax, (2.0, 4.5), (2.0, 3.5), "no: a CPU")
    card = name(resolve_dtype("auto", device="cuda", checkpoint_dtype="bfloat16"))
    box(ax, 5.0, 4.5, 4.6, 0.9, f"the checkpoint's torch_dtype\n(e.g. {card})", "memory",
        fontsize=9)
    arrow(ax, (3.7, 4.95), (5.0, 4.95), "yes")
    cases = [({"avx512f", "avx512_bf16"}, 2.55, "yes"), ({"avx2", "avx512f"}, 0.55, "no")]
    for flags, y, word in cases:
        got = name(resolve_dtype("auto", flags=flags))
        bf16 = got == "bfloat16"
        why = textwrap.fill(reason("auto", flags=flags), 36)
        box(ax, 5.0, y, 4.6, 1.25, f"{got}\n{why}", "compute" if bf16 else "highlight",
            fontsize=8.5, text_color="white" if bf16 else COLORS["ink"])
        arrow(ax, (2.0 if word == "no" else 3.7, 2.3 if word == "no" else 2.9),
              (5.0, y + 0.62), word)
    ax.text(0.3, 0.1, 'an explicit dtype ("float32", "bfloat16") always wins: "as asked"',
            fontsize=8.5, color=COLORS["ink"])
    ax.set_title('What dtype="auto" picks', loc="left", fontsize=11.5)


STEPS = [("embed", "bf16"), ("RMSNorm\nstatistics", "fp32"), ("QKV\nmatmul", "bf16"),
         ("RoPE\nangles", "fp32"), ("gathered decode\nscores", "fp32"),
         ("o_proj,\nMLP", "bf16"), ("LM head", "bf16"), ("logits\n.float()", "fp32"),
         ("sampler,\nlogprobs", "fp32")]


def islands(ax) -> None:
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 7.4)
    ax.axis("off")
    for i, (label, dt) in enumerate(STEPS):
        y = 6.3 - i * 0.72
        color = "compute" if dt == "bf16" else "highlight"
        box(ax, 1.2, y, 4.4, 0.5, label.replace("\n", " "), color, fontsize=9,
            text_color="white" if dt == "bf16" else COLORS["ink"])
        ax.text(6.0, y + 0.25, "bfloat16" if dt == "bf16" else "float32", va="center",
                fontsize=9, color=COLORS["ink"])
        if i:
            arrow(ax, (3.4, y + 0.72), (3.4, y + 0.5))
    ax.set_title("A bf16 model: where float32 stays", loc="left", fontsize=11.5)


if __name__ == "__main__":
    fig, (left, right) = figure(width=12.5, height=5.2, ncols=2,
                                gridspec_kw={"width_ratios": [1.5, 1]})
    decision(left)
    islands(right)
    save(fig, __file__, "dtype-auto")
