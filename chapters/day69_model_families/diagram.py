"""Day 69's figures: the per-layer attention pattern of three published shapes, and the path
from a config.json to the class that serves it.

    python chapters/day69_model_families/diagram.py

writes into build/figures/day69_model_families/:

- ``layer-pattern.png``: one row per published shape (SmolLM2-135M, Qwen3-0.6B, Gemma-3-270M),
  one cell per decoder layer, coloured by what the family's hooks say of that layer: full
  attention or a sliding window, and the RoPE base it rotates with. Read from the models the
  claims build on the meta device (``layer_windows`` and, for Gemma, ``rope_by_type``).
- ``registry-path.png``: the steps ``load_model`` takes from ``config.json`` to a built model,
  with the hooks each step asks of the family and where a config is refused.

Nothing is timed; both figures come from code and configs alone.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day69_model_families.claims import meta_model  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

SHAPES = [("SmolLM2-135M (Llama)", "smollm2-135m"), ("Qwen3-0.6B", "qwen3-0.6b"),
          ("Gemma-3-270M", "gemma-3-270m")]


def layer_bases(m) -> list[float]:
    """Each layer's RoPE base: Gemma's per layer type, the others' one ``rope_theta``."""
    if hasattr(m, "types"):
        from nanoserve.model.gemma3 import rope_by_type

        bases = rope_by_type(m.cfg)
        return [bases[t][0] for t in m.types]
    return [m.cfg.rope_theta] * m.cfg.num_hidden_layers


def short(base: float) -> str:
    return f"{base / 1e6:g}M" if base >= 1e6 else f"{base / 1e3:g}k"


def draw_pattern(ax) -> None:
    width = max(meta_model(s).cfg.num_hidden_layers for _, s in SHAPES)
    for row, (name, shape) in enumerate(SHAPES):
        m = meta_model(shape)
        y = len(SHAPES) - 1 - row
        for i, (w, base) in enumerate(zip(m.windows, layer_bases(m), strict=True)):
            color = "memory" if w is not None else "compute"
            box(ax, i + 0.06, y + 0.1, 0.88, 0.8,
                f"{'w' + str(w) if w else 'full'}\n{short(base)}", color=color, fontsize=6)
        ax.text(-0.3, y + 0.5, name, ha="right", va="center", fontsize=9.5)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-0.1, len(SHAPES))
    ax.set_xticks([i + 0.5 for i in range(0, width, 2)])
    ax.set_xticklabels([str(i) for i in range(0, width, 2)], fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("decoder layer")
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.plot([], [], "s", color=COLORS["compute"], label="full attention")
    ax.plot([], [], "s", color=COLORS["memory"], label="sliding window (w = tokens)")
    ax.legend(loc="lower right", fontsize=9)
    ax.set_title("Each layer's attention and RoPE base, as the family's hooks read the "
                 "published config", fontsize=11, loc="left")


STEPS = [  # (text, the hooks or module it asks, what it refuses or None)
    ("config.json", "text_config lifted, its class's defaults\n(config/text_config.py)",
     "unknown rope_type:\nkey and value"),
    ("architectures[0]", "MODEL_FAMILIES -> family class\n(model/registry.py)",
     "not served:\nthe supported list"),
    ("what it cannot honour", "rope_types, check_config,\nactivation",
     "a key it cannot honour:\nkey and value"),
    ("build on meta", "layer_shape, layer_class, norm_class,\nlayer_windows", None),
    ("weights", "HF names fused, or read fused (Phi-3);\nvision tower left out",
     "a tensor missing or extra:\nits name"),
    ("prepare", "fused_problem: C++ forward or its own layers;\ntp_class under -tp", None),
]


def draw_path(ax) -> None:
    n = len(STEPS)
    for i, (title, hooks, refusal) in enumerate(STEPS):
        y = n - 1 - i
        box(ax, 0, y + 0.12, 2.6, 0.76, title, color="compute", fontsize=9.5)
        ax.text(2.85, y + 0.5, hooks, ha="left", va="center", fontsize=8.5, color=COLORS["ink"])
        if refusal:
            box(ax, 7.3, y + 0.17, 2.4, 0.66, "ValueError\n" + refusal, color="waste",
                fontsize=7.5)
            ax.annotate("", xy=(7.28, y + 0.5), xytext=(6.6, y + 0.5),
                        arrowprops=dict(arrowstyle="->", color=COLORS["waste"], ls="--"))
        if i < n - 1:
            ax.annotate("", xy=(1.3, y - 0.12), xytext=(1.3, y + 0.12),
                        arrowprops=dict(arrowstyle="->", color=COLORS["ink"], lw=1.2))
    ax.set_xlim(-0.2, 9.8)
    ax.set_ylim(-0.1, n)
    ax.axis("off")
    ax.set_title("From config.json to the class that serves it", fontsize=11, loc="left")


if __name__ == "__main__":
    fig, ax = figure(width=11, height=2.6)
    draw_pattern(ax)
    fig.tight_layout()
    save(fig, __file__, "layer-pattern")

    fig, ax = figure(width=9, height=4.6)
    draw_path(ax)
    fig.tight_layout()
    save(fig, __file__, "registry-path")
