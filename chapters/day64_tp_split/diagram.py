"""Day 64's figures: one layer's weights cut over 2 ranks, and KV heads split or replicated.

    python chapters/day64_tp_split/diagram.py

writes two files into build/figures/day64_tp_split/:

- tp-layer.png: every weight matrix of one nanoserve-tiny layer drawn at its shape (output
  features down, input features across), each rank's rows or columns in that rank's colour,
  the norms that both ranks hold whole, and the two all-reduces that end the attention and the
  MLP.
- kv-heads.png: SmolLM2-135M's 9 query heads over 3 KV heads on 2 ranks (whole heads, 1 and 2),
  and nanoserve-tiny's 8 over 4 on 8 ranks (each KV head replicated on the 2 ranks that read
  it); a line joins each query head to the KV head it reads.

Every cut comes from the frozen snapshot's plan over the models' config.json shapes; no weights
are read and no model is loaded.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib import colormaps  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day64_tp_split.snapshot.shard import Shape, plan  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402
from nanoserve.bench.shapes import shape_config  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = json.loads((ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny" / "config.json")
                  .read_text())
RANK = (COLORS["compute"], COLORS["memory"])  # rank 0, rank 1
UNIT = 64  # features per unit of drawing


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}"


def layer_figure() -> None:
    cfg, tp = TINY, 2
    shape = Shape.of(cfg)
    plans = [plan(shape, tp, r) for r in range(tp)]
    e, d = cfg["hidden_size"], shape.head_dim
    q, kv, inter = shape.heads * d, shape.kv_heads * d, shape.intermediate
    # Two rows, in the order a token meets them: (HF part, label, output, input features).
    attention = [("input_layernorm", "norm", e, 0), ("self_attn.q_proj", "q_proj", q, e),
                 ("self_attn.k_proj", "k_proj", kv, e), ("self_attn.v_proj", "v_proj", kv, e),
                 ("box", "attention\nhead by head", 0, 0), ("self_attn.o_proj", "o_proj", e, q),
                 ("all-reduce", "", e, 0)]
    mlp = [("post_attention_layernorm", "norm", e, 0), ("mlp.gate_proj", "gate_proj", inter, e),
           ("mlp.up_proj", "up_proj", inter, e), ("box", "SiLU(gate)\n× up", 0, 0),
           ("mlp.down_proj", "down_proj", e, inter), ("all-reduce", "", e, 0)]
    fig, ax = figure(width=12, height=8.6)
    gap, top = 2.2, {"attention": 0.0, "MLP": e / UNIT + 5.2}
    for row, steps in (("attention", attention), ("MLP", mlp)):
        x, y0 = 0.0, top[row]
        ax.text(-1.2, y0 + 2.0, row, ha="right", va="center", fontsize=11, fontweight="bold",
                rotation=90)
        for part, label, out, inp in steps:
            if part == "all-reduce":
                ax.plot([x, x], [y0 - 0.6, y0 + out / UNIT + 0.6], color=COLORS["highlight"],
                        linewidth=4, solid_capstyle="butt")
                ax.text(x + 0.5, y0 + out / UNIT / 2, f"all-reduce\n(T, {e})\nsum of the\n"
                        f"partial sums", ha="left", va="center", fontsize=9,
                        fontweight="bold", color=COLORS["ink"])
                continue
            if part == "box":
                box(ax, x, y0 + 0.6, 2.8, 2.8, label, color="muted", fontsize=9,
                    text_color=COLORS["ink"])
                x += 2.8 + gap
                continue
            if part.endswith("layernorm"):
                w, h = 0.45, out / UNIT
                ax.add_patch(Rectangle((x, y0), w, h, facecolor=COLORS["reference"],
                                       edgecolor=COLORS["ink"], linewidth=0.6))
                ax.text(x + w / 2, y0 - 0.3, "norm\nwhole", ha="center", va="bottom",
                        fontsize=8.5)
                x += w + gap
                continue
            w, h = inp / UNIT, out / UNIT
            name = f"model.layers.0.{part}.weight"
            ranges = []
            for r, p in enumerate(plans):
                how, lo, hi = p.cut(name, d)
                ranges.append(_span(lo, hi))
                if how == "rows":
                    rect = (x, y0 + lo / UNIT, w, (hi - lo) / UNIT)
                else:
                    rect = (x + lo / UNIT, y0, (hi - lo) / UNIT, h)
                ax.add_patch(Rectangle(rect[:2], *rect[2:], facecolor=RANK[r], alpha=0.9,
                                       edgecolor=COLORS["paper"], linewidth=1.2))
                if min(rect[2], rect[3]) >= 1.5:
                    ax.text(rect[0] + rect[2] / 2, rect[1] + rect[3] / 2, f"rank {r}",
                            ha="center", va="center", fontsize=8.5, color=COLORS["paper"],
                            rotation=90 if how == "cols" else 0)
            ax.add_patch(Rectangle((x, y0), w, h, fill=False, edgecolor=COLORS["ink"],
                                   linewidth=0.8))
            how = plans[0].cut(name, d)[0]
            kind = "column-parallel" if how == "rows" else "row-parallel"
            ax.text(x + w / 2, y0 - 0.3, f"{label}  {out} × {inp}\n{kind}\n{how} "
                    f"{' | '.join(ranges)}", ha="center", va="bottom", fontsize=8.5)
            x += w + gap
    ax.set_xlim(-2.0, 36)
    ax.set_ylim(top["MLP"] + inter / UNIT + 0.8, -3.2)
    ax.set_aspect("equal")
    ax.axis("off")
    vocab = "; ".join(f"rank {p.rank} rows {_span(*p.vocab)}" for p in plans)
    ax.set_title(f"One layer of nanoserve-tiny over {tp} ranks, each weight drawn at its "
                 f"shape\n(output features down, input features across); embedding and tied "
                 f"LM head by vocabulary: {vocab}", fontsize=11, loc="left")
    ax.legend(handles=[Patch(color=RANK[0], label="rank 0"), Patch(color=RANK[1], label="rank 1"),
                       Patch(color=COLORS["reference"], label="held whole by both"),
                       Line2D([], [], color=COLORS["highlight"], linewidth=4,
                              label="the ranks meet")],
              loc="lower right", ncols=1, fontsize=9.5, bbox_to_anchor=(1.0, 0.02))
    save(fig, __file__, "tp-layer")


def heads(ax, config: dict, tp: int, colors, title: str) -> None:
    """Query heads on top, each rank's KV heads below, a line from each query head to the copy
    of its KV head on its own rank."""
    s = Shape.of(config)
    group = s.heads // s.kv_heads
    plans = [plan(s, tp, r) for r in range(tp)]
    owner = {h: p.rank for p in plans for h in range(*p.q)}
    for h in range(s.heads):
        r = owner[h]
        ax.add_patch(Rectangle((h + 0.1, 2.0), 0.8, 0.8, facecolor=colors[r],
                               edgecolor=COLORS["ink"], linewidth=0.6))
        ax.text(h + 0.5, 2.4, f"q{h}", ha="center", va="center", fontsize=8,
                color=COLORS["paper"])
    # Each rank's KV heads, drawn under that rank's query heads.
    for p in plans:
        qlo, qhi = p.q
        kvs = list(range(*p.kv))
        width = (qhi - qlo) / len(kvs)
        for i, k in enumerate(kvs):
            x0 = qlo + i * width
            ax.add_patch(Rectangle((x0 + 0.15, 0.0), width - 0.3, 0.8, facecolor=colors[p.rank],
                                   edgecolor=COLORS["ink"], linewidth=0.6,
                                   hatch="//" if p.replicated else None))
            ax.text(x0 + width / 2, 0.4, f"kv{k}", ha="center", va="center", fontsize=8,
                    color=COLORS["paper"])
            for h in range(max(qlo, k * group), min(qhi, (k + 1) * group)):
                ax.plot([h + 0.5, x0 + width / 2], [2.0, 0.8], color=COLORS["ink"],
                        linewidth=0.8)
        ax.text((qlo + qhi) / 2, -0.25, f"rank {p.rank}", ha="center", va="top", fontsize=8.5)
    ax.set_xlim(-0.2, s.heads + 0.2)
    ax.set_ylim(-0.9, 3.0)
    ax.axis("off")
    ax.set_title(title, fontsize=10.5, loc="left")


def kv_figure() -> None:
    smol = shape_config("smollm2-135m")
    fig, axes = figure(width=13, height=3.6, ncols=2)
    p0, p1 = (plan(Shape.of(smol), 2, r) for r in (0, 1))
    heads(axes[0], smol, 2, RANK,
          f"SmolLM2-135M over 2 ranks: KV heads split by whole heads\nrank 0: KV head "
          f"{_span(*p0.kv)}, query heads {_span(*p0.q)}; rank 1: KV heads {_span(*p1.kv)}, "
          f"query heads {_span(*p1.q)}")
    tab = colormaps["tab10"]
    s = Shape.of(TINY)
    heads(axes[1], TINY, 8, [tab(r) for r in range(8)],
          f"nanoserve-tiny over 8 ranks: {s.kv_heads} KV heads, each replicated\n"
          f"(hatched) on the {8 // s.kv_heads} ranks whose query heads read it")
    fig.suptitle("Each query head sits on the rank that holds its KV head", fontsize=12.5,
                 fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "kv-heads")


if __name__ == "__main__":
    layer_figure()
    kv_figure()
