"""One visual language for every chapter's figures.

Why this module exists: a reader moves between forty chapters, and a figure should be readable at
page width without learning a new colour code each time. So every ``diagram.py`` draws through
these helpers: the same palette (one colour per *role*: compute, memory, waste, reference, ...),
the same fonts and sizes, the same way of saving (PNG at 150 dpi into
``build/figures/<chapter>/``).

    from diagrams import COLORS, figure, save
    fig, ax = figure(width=8, height=4)
    ax.bar(["cached", "uncached"], [79, 3040], color=[COLORS["compute"], COLORS["waste"]])
    save(fig, __file__, "tokens-computed")
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# A colour per role, so that "waste" is the same red in every chapter.
COLORS = {
    "compute": "#2f6db5",    # useful work: forward passes, tokens that count
    "memory": "#3a9e6e",     # KV cache, blocks, bytes held for a reason
    "waste": "#d1495b",      # recomputation, padding, reserved-but-unused
    "reference": "#7a7a7a",  # the baseline or the thing we check against
    "highlight": "#e8a33d",  # the one thing the figure is about
    "ink": "#222222",
    "paper": "#ffffff",
    "muted": "#e9edf2",
}

plt.rcParams.update({
    "figure.dpi": 150,
    "savefig.dpi": 150,
    "font.family": "DejaVu Sans",
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": COLORS["muted"],
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "savefig.bbox": "tight",
    "savefig.facecolor": COLORS["paper"],
})


def figure(width: float = 9.0, height: float = 4.5, ncols: int = 1, nrows: int = 1, **kw):
    """A figure at the book's page width (9 in) with the shared style applied."""
    return plt.subplots(nrows, ncols, figsize=(width, height), **kw)


def box(ax, x: float, y: float, w: float, h: float, text: str, color: str = "compute",
        fontsize: int = 10, text_color: str = "white"):
    """A labelled rounded box, for block diagrams drawn in data coordinates."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=COLORS.get(color, color), edgecolor=COLORS["ink"],
                                linewidth=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
            color=text_color, wrap=True)


def out_dir(diagram_file: str) -> Path:
    """build/figures/<chapter folder>/ for the chapter whose diagram.py is ``diagram_file``."""
    chapter = Path(diagram_file).resolve().parent.name
    d = ROOT / "build" / "figures" / chapter
    d.mkdir(parents=True, exist_ok=True)
    return d


def save(fig, diagram_file: str, name: str) -> Path:
    path = out_dir(diagram_file) / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}")
    return path
