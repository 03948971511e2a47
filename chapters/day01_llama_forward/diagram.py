"""Day 1's figures: one decoder layer with its tensor shapes, and where a Llama's parameters live.

    python chapters/day01_llama_forward/diagram.py

writes build/figures/day01_llama_forward/decoder-layer.png and parameters.png. Parameter counts
come from the Day 1 snapshot's own ``Llama``, built on the meta device (no memory, no weights),
for Llama-3.2-1B's published config and for nanoserve-tiny's.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from chapters.common import LLAMA_3_2_1B  # noqa: E402
from chapters.day01_llama_forward.snapshot.config import ModelConfig  # noqa: E402
from chapters.day01_llama_forward.snapshot.model import Llama  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

# nanoserve-tiny, as tools/train_tiny.py builds it (the config.json it ships says the same).
TINY = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 32, "tie_word_embeddings": True}


# ------------------------------------------------------------------ figure 1: the decoder layer
def arrow(ax, x0, y0, x1, y1):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=11,
                                 color=COLORS["ink"], linewidth=1.0, shrinkA=0, shrinkB=0))


def decoder_layer() -> None:
    fig, ax = figure(width=9, height=10.6)
    ax.axis("off")

    x0, w = 1.2, 4.3          # the main column
    cx = x0 + w / 2
    h = 0.62                  # box height
    note_x = 5.85             # where the shape annotations start
    mono = {"family": "DejaVu Sans Mono", "fontsize": 9.5, "color": COLORS["ink"],
            "va": "center"}

    # (label, role, text colour, shape note) from top to bottom; None marks a residual add.
    steps = [
        ("token ids", "muted", "ink", "(B, T)  integers < V"),
        ("embed_tokens  (V × E table)", "memory", "white", "x: (B, T, E) = (B, T, 256)"),
        ("RMSNorm  (input_layernorm)", "muted", "ink", "(B, T, E), computed in fp32"),
        ("qkv_proj  (one fused matmul)", "compute", "white",
         "q: (B, T, Hq·D) = (B, T, 256)\nk, v: (B, T, Hkv·D) = (B, T, 128)"),
        ("RoPE on q and k", "highlight", "white",
         "q: (B, Hq, T, D) = (B, 8, T, 32)\nk: (B, Hkv, T, D) = (B, 4, T, 32)"),
        ("causal attention, GQA", "highlight", "white",
         "each KV head serves Hq/Hkv = 2\nquery heads → (B, Hq, T, D)"),
        ("o_proj", "compute", "white", "(B, T, Hq·D) → (B, T, E)"),
        None,
        ("RMSNorm  (post_attention_layernorm)", "muted", "ink", "(B, T, E)"),
        ("gate_up_proj  (one fused matmul)", "compute", "white",
         "gate, up: (B, T, I) = (B, T, 688)"),
        ("SiLU(gate) × up", "muted", "ink", "(B, T, I)"),
        ("down_proj", "compute", "white", "(B, T, I) → (B, T, E)"),
        None,
        ("final RMSNorm", "muted", "ink", "hidden: (B, T, E)"),
        ("LM head = embed_tokensᵀ  (tied)", "memory", "white",
         "logits: (B, T, V) = (B, T, 2,048), fp32"),
    ]

    ys, y = [], 16.4
    for i, step in enumerate(steps):
        ys.append(y)
        y -= 0.95 if step is None else 1.08
        if i in (1, 12):  # room for the layer frame's label above, and below the frame
            y -= 0.45
    ax.set_xlim(0, 10.4)
    ax.set_ylim(ys[-1] - 0.55, ys[0] + 0.55)

    # The repeated block behind the layer's boxes.
    top, bottom = ys[2] + h / 2 + 0.62, ys[12] - 0.42
    ax.add_patch(Rectangle((0.15, bottom), 10.1, top - bottom, facecolor="#f6f8fb",
                           edgecolor=COLORS["reference"], linewidth=0.9, linestyle="--"))
    ax.text(10.1, top - 0.22, "decoder layer × L   (L = 4 in nanoserve-tiny, 16 in Llama-3.2-1B)",
            ha="right", va="top", fontsize=9.5, color=COLORS["reference"], style="italic")

    residual_from, prev_bottom = None, None
    for i, (step, yc) in enumerate(zip(steps, ys, strict=True)):
        if step is None:  # a residual add: the stream that skipped the sub-block comes back
            arrow(ax, cx, prev_bottom, cx, yc + 0.2)
            ax.plot([cx], [yc], marker="o", markersize=17, markerfacecolor="white",
                    markeredgecolor=COLORS["ink"], markeredgewidth=1.0, zorder=3)
            ax.text(cx, yc - 0.02, "+", ha="center", va="center", fontsize=13, zorder=4)
            # the skip path leaves the stream above the norm and runs down the left rail
            ax.plot([cx, 0.7, 0.7], [residual_from, residual_from, yc],
                    color=COLORS["ink"], linewidth=1.0)
            ax.plot([cx], [residual_from], marker="o", markersize=4, color=COLORS["ink"])
            arrow(ax, 0.7, yc, cx - 0.2, yc)
            ax.text(0.5, (residual_from + yc) / 2, "residual", rotation=90, ha="center",
                    va="center", fontsize=9, color=COLORS["reference"])
            ax.text(note_x, yc, "x = x + sub-block(norm(x))", **mono)
            prev_bottom = yc - 0.2
            continue
        label, role, text_color, note = step
        box(ax, x0, yc - h / 2, w, h, label, color=role, fontsize=10,
            text_color=COLORS[text_color] if text_color == "ink" else text_color)
        ax.text(note_x, yc, note, **mono)
        if prev_bottom is not None:
            arrow(ax, cx, prev_bottom, cx, yc + h / 2)
        if i in (2, 8):  # each sub-block starts from the residual stream entering its norm
            residual_from = yc + h / 2 + 0.2
        prev_bottom = yc - h / 2

    ax.set_title("A Llama decoder layer, with nanoserve-tiny's shapes\n"
                 "E = 256 hidden, Hq = 8 query heads, Hkv = 4 KV heads, D = 32 head_dim, "
                 "I = 688, V = 2,048", fontsize=12)
    save(fig, __file__, "decoder-layer")


# ------------------------------------------------------------- figure 2: where parameters live
def parameter_groups(config: dict) -> dict[str, int]:
    """Parameters by tensor family, splitting nanoserve's fused matmuls back into HF's names."""
    cfg = ModelConfig.from_dict(config)
    with torch.device("meta"):
        model = Llama(cfg)
    groups = dict.fromkeys(["embedding (tied LM head)", "q_proj", "k_proj", "v_proj", "o_proj",
                            "gate_proj", "up_proj", "down_proj", "RMSNorm weights"], 0)
    E, inter = cfg.hidden_size, cfg.intermediate_size
    for name, p in model.named_parameters():
        if name.startswith("embed_tokens"):
            groups["embedding (tied LM head)"] += p.numel()
        elif "qkv_proj" in name:
            groups["q_proj"] += cfg.q_size * E
            groups["k_proj"] += cfg.kv_size * E
            groups["v_proj"] += cfg.kv_size * E
        elif "gate_up_proj" in name:
            groups["gate_proj"] += inter * E
            groups["up_proj"] += inter * E
        elif "norm" in name:
            groups["RMSNorm weights"] += p.numel()
        else:
            groups[name.split(".")[-2]] += p.numel()
    assert sum(groups.values()) == model.num_parameters()
    return groups


ROLE = {"embedding (tied LM head)": "highlight", "q_proj": "compute", "k_proj": "compute",
        "v_proj": "compute", "o_proj": "compute", "gate_proj": "memory", "up_proj": "memory",
        "down_proj": "memory", "RMSNorm weights": "reference"}


def shares(groups: dict[str, int]) -> dict[str, float]:
    total = sum(groups.values())
    attn = sum(groups[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp = sum(groups[k] for k in ("gate_proj", "up_proj", "down_proj"))
    return {"embedding": groups["embedding (tied LM head)"] / total, "attention": attn / total,
            "MLP": mlp / total}


def parameters() -> None:
    big, tiny = parameter_groups(LLAMA_3_2_1B), parameter_groups(TINY)
    total = sum(big.values())
    fig, (ax, ax2) = figure(width=9.5, height=4.6, ncols=2,
                            gridspec_kw={"width_ratios": [1.6, 1]})

    names = list(big)[::-1]
    values = [big[n] / 1e6 for n in names]
    ax.barh(names, values, color=[COLORS[ROLE[n]] for n in names], edgecolor=COLORS["ink"],
            linewidth=0.5)
    for yi, v in enumerate(values):
        ax.text(v + 6, yi, f"{v:,.1f} M" if v >= 1 else f"{v * 1e3:,.0f} k", va="center",
                fontsize=9)
    ax.set_xlim(0, 340)
    ax.set_xlabel("parameters (millions), summed over all 16 layers")
    ax.set_title(f"Llama-3.2-1B: {total:,} parameters\n"
                 f"= {total * 2 / 1e9:.2f} GB of weights in bf16", fontsize=11.5)
    ax.grid(axis="y", visible=False)

    parts = ["embedding", "attention", "MLP"]  # the norms (< 0.1%) would not show
    colors = [COLORS[c] for c in ("highlight", "compute", "memory")]
    models = {f"Llama-3.2-1B\n{total / 1e9:.2f} B": shares(big),
              f"nanoserve-tiny\n{sum(tiny.values()) / 1e6:.2f} M": shares(tiny)}
    for col, sh in enumerate(models.values()):
        bottom = 0.0
        for part, color in zip(parts, colors, strict=True):
            ax2.bar(col, sh[part], bottom=bottom, color=color, edgecolor=COLORS["ink"],
                    linewidth=0.5, width=0.62)
            ax2.text(col, bottom + sh[part] / 2, f"{part}\n{sh[part]:.1%}", ha="center",
                     va="center", fontsize=9,
                     color=COLORS["ink"] if part == "embedding" else "white")
            bottom += sh[part]
    ax2.set_xticks([0, 1], list(models))
    ax2.set_xlim(-0.5, 1.5)
    ax2.set_ylim(0, 1)
    ax2.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax2.set_ylabel("share of all parameters")
    ax2.set_title("Same recipe, two sizes", fontsize=11.5)
    ax2.grid(axis="x", visible=False)
    fig.tight_layout()
    save(fig, __file__, "parameters")


if __name__ == "__main__":
    decoder_layer()
    parameters()
