"""Day 67's figure: what the grammar allows after ``{``, and where the model's probability goes.

    python chapters/day67_structured_outputs/diagram.py

writes build/figures/day67_structured_outputs/after-brace.png from the claims' own
measurement (``claims.after_brace``): the shipped nanoserve-tiny in float32 reads the prompt
and ``{``, the one-field schema's matcher is advanced by ``{``, and the mask is filled.

- left: the tokens the mask allows, compact and with any whitespace, split into whitespace
  tokens and the rest;
- right: the share of the allowed probability that whitespace holds under each grammar, and
  the likeliest allowed token.

It loads the tiny model and runs one prefill and one decode per grammar; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day67_structured_outputs.claims import PROMPT, after_brace  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

GRAMMARS = [("compact\n(default)", False), ("any whitespace", True)]


def draw_counts(ax, rows: list[dict]) -> None:
    names = [name for name, _ in GRAMMARS]
    other = [r["allowed"] - r["space"] for r in rows]
    space = [r["space"] for r in rows]
    ax.bar(names, other, color=COLORS["compute"], label="not whitespace")
    ax.bar(names, space, bottom=other, color=COLORS["waste"], label="whitespace")
    for i, r in enumerate(rows):
        ax.text(i, r["allowed"] + 0.8, f"{r['allowed']} allowed\n({r['space']} whitespace)",
                ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, max(r["allowed"] for r in rows) * 1.3)
    ax.set_ylabel("tokens the mask allows after {")
    ax.legend(loc="upper left", fontsize=8.5)
    ax.set_title("The mask after {, one-field schema", fontsize=11, loc="left")


def draw_mass(ax, rows: list[dict]) -> None:
    names = [name for name, _ in GRAMMARS]
    space = [100 * r["space_mass"] for r in rows]
    ax.barh(names, [100 - s for s in space], color=COLORS["compute"], label="not whitespace")
    ax.barh(names, space, left=[100 - s for s in space], color=COLORS["waste"],
            label="whitespace")
    for i, r in enumerate(rows):
        ax.text(50, i, f"whitespace {r['space_mass']:.1%}; likeliest: {r['top']!r}",
                ha="center", va="center", fontsize=9, color=COLORS["paper"])
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the allowed probability (%)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, fontsize=8.5)
    ax.set_title(f"nanoserve-tiny after {PROMPT!r} + {{", fontsize=11, loc="left")


if __name__ == "__main__":
    rows = [after_brace(any_ws) for _, any_ws in GRAMMARS]
    fig, axes = figure(width=11, height=4.2, ncols=2)
    draw_counts(axes[0], rows)
    draw_mass(axes[1], rows)
    fig.tight_layout()
    save(fig, __file__, "after-brace")
