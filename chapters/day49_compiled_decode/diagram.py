"""Day 49's figure: what the compiler sees of a decode step, and the buckets it compiles for.

    python chapters/day49_compiled_decode/diagram.py

writes build/figures/day49_compiled_decode/compiled-decode.png. Left: one decoder layer of the
decode forward as inductor receives it: the elementwise work it fuses, the four projections it
hands back to aten's matmul, and the attention read behind the opaque ``paged_attend`` op, which
runs eagerly on the real rows. Right: every batch size from 1 to 12 padded up to its bucket by
the frozen ``decode_buckets``, real rows and pad rows stacked. Nothing is timed or compiled.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch, Patch  # noqa: E402

from chapters.day49_compiled_decode.snapshot.compiled import decode_buckets  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

# One decoder layer, top to bottom: (label, role). Roles: fused by inductor, a matmul handed
# to aten (oneDNN/MKL underneath), or the opaque custom op.
LAYER = [("RMSNorm", "fused"), ("qkv_proj", "mm"), ("RoPE", "fused"),
         ("paged_attend\n(opaque: the cache's\nwrite + read, eager)", "opaque"),
         ("o_proj", "mm"), ("residual add + RMSNorm", "fused"), ("gate_up_proj", "mm"),
         ("SiLU x up", "fused"), ("down_proj", "mm"), ("residual add", "fused")]
ROLE = {"fused": ("compute", "white", "fused by inductor (C++ loops)"),
        "mm": ("reference", "white", "matmul handed back to aten"),
        "opaque": ("highlight", COLORS["ink"], "custom op: never traced")}


def layer(ax) -> None:
    gap, heights = 0.25, [1.3 if role == "opaque" else 0.6 for _, role in LAYER]
    top = sum(heights) + gap * (len(LAYER) - 1)
    ax.set_xlim(0, 6)
    ax.set_ylim(-2.2, top + 0.7)
    ax.axis("off")
    y = top
    for i, ((label, role), h) in enumerate(zip(LAYER, heights, strict=True)):
        color, ink, _ = ROLE[role]
        if i:
            ax.add_patch(FancyArrowPatch((3.0, y + gap), (3.0, y), arrowstyle="-|>",
                                         mutation_scale=8, color=COLORS["ink"], linewidth=0.8))
        box(ax, 1.0, y - h, 4.0, h, label, color, fontsize=8.5, text_color=ink)
        y -= h + gap
    ax.text(3.0, top + 0.35, "one decoder layer of the traced decode forward (x4)",
            ha="center", fontsize=9)
    ax.legend(handles=[Patch(facecolor=COLORS[c], label=t) for c, _, t in ROLE.values()],
              loc="lower center", ncol=1, fontsize=8)
    ax.set_title("What inductor is given", loc="left", fontsize=11.5)


def buckets(ax, max_num_seqs: int = 12) -> None:
    bs = decode_buckets(max_num_seqs)
    sizes = list(range(1, max_num_seqs + 1))
    bucket = [next(b for b in bs if b >= n) for n in sizes]
    ax.bar(sizes, sizes, color=COLORS["compute"], label="real rows")
    ax.bar(sizes, [b - n for b, n in zip(bucket, sizes, strict=True)], bottom=sizes,
           color=COLORS["waste"], label="pad rows (token 0 at position 0, never written)")
    for b in bs:
        ax.axhline(b, color=COLORS["reference"], linewidth=0.8, linestyle=":")
        ax.text(max_num_seqs + 0.7, b, f"graph {b}", va="center", fontsize=8.5)
    ax.set_xticks(sizes)
    ax.set_xlabel("rows in the decode step")
    ax.set_ylabel("rows the compiled graph computes")
    ax.set_xlim(0.3, max_num_seqs + 2.6)
    ax.set_ylim(0, max_num_seqs * 1.35)
    ax.legend(loc="upper left", fontsize=8.5)
    ax.set_title(f"{len(bs)} graphs cover batch sizes 1 to {max_num_seqs}", loc="left",
                 fontsize=11.5)


if __name__ == "__main__":
    fig, (left, right) = figure(width=12, height=5.2, ncols=2,
                                gridspec_kw={"width_ratios": [1, 1.3]})
    layer(left)
    buckets(right)
    save(fig, __file__, "compiled-decode")
