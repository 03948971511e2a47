"""Day 46's figure: the fuzzer's cases by category, and where the first run's five bugs sat.

    python chapters/day46_bad_input/diagram.py

writes build/figures/day46_bad_input/fuzz-cases.png. Left: the cases of
``bad_requests(seed=46, vocab_size=2048, max_model_len=1024)`` counted by category (the claims
send every one to a live server; nothing is sent here). Right: the layers a body passes through
on its way in, from the connection to the engine step, with each of the five bugs at the layer
where it lived. Nothing is measured or timed.
"""

import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.common import SHIPPED  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402
from nanoserve.bench.fuzz import CATEGORIES, bad_requests  # noqa: E402

LAYERS = [  # (layer, the bug that lived there, or None)
    ("HTTP connection (keep-alive)", "413 left the body unread:\nthe next request was reset"),
    ("Content-Type", "text/plain and form\nbodies were accepted"),
    ("bytes -> text (UTF-8)", "an encoded surrogate\nreached the tokenizer: 500"),
    ("JSON decoder", "5,000 brackets:\nRecursionError, 500"),
    ("pydantic model + server checks", None),
    ("the sampler's tensors", "top_k 10^30 overflowed:\nthe whole step failed"),
    ("engine step (the batch)", None),
]


def main() -> None:
    cfg = json.loads((SHIPPED / "config.json").read_text())
    cases = bad_requests(seed=46, vocab_size=cfg["vocab_size"],
                         max_model_len=cfg["max_position_embeddings"])
    counts = collections.Counter(c.category for c in cases)
    names = list(CATEGORIES)[::-1]

    fig, (ax, bx) = figure(width=13, height=6.2, ncols=2,
                           gridspec_kw={"width_ratios": [1.0, 1.15]})
    ax.barh(names, [counts[n] for n in names], color=COLORS["compute"])
    for i, n in enumerate(names):
        ax.text(counts[n] + 3, i, str(counts[n]), va="center", fontsize=9,
                color=COLORS["ink"])
    ax.set_xlabel("distinct cases")
    ax.set_xlim(0, max(counts.values()) * 1.15)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_title(f"{len(cases)} cases, seed 46, 16 categories")
    ax.grid(axis="y", visible=False)

    bx.set_xlim(0, 10)
    bx.set_ylim(-0.3, len(LAYERS) + 0.2)
    bx.axis("off")
    bx.set_title("where the first run's five bugs sat")
    for k, (layer, bug) in enumerate(LAYERS):
        y = len(LAYERS) - 1 - k
        box(bx, 0.1, y + 0.12, 4.6, 0.72, layer, color="memory" if bug is None else "waste",
            fontsize=9.5)
        if bug is not None:
            bx.text(5.0, y + 0.48, bug, va="center", fontsize=9, color=COLORS["waste"])
        if k < len(LAYERS) - 1:
            bx.annotate("", (2.4, y + 0.1), (2.4, y - 0.14),
                        arrowprops=dict(arrowstyle="<-", color=COLORS["ink"], lw=1.0))
    bx.text(0.1, -0.25, "a body enters at the top; each bug is now refused with a 4xx at or "
            "above its layer", fontsize=9, color=COLORS["reference"])
    fig.suptitle("Day 46: the bad-input fuzzer (nanoserve-tiny, float32, 2-core CPU server)",
                 fontsize=12, fontweight="bold")
    save(fig, __file__, "fuzz-cases")


if __name__ == "__main__":
    main()
