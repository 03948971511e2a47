"""Day 68's figures: one step's bitmask in the batch, and what applying it costs.

    python chapters/day68_mask_in_batch/diagram.py

writes into build/figures/day68_mask_in_batch/:

- ``batch-mask.png``: the shipped nanoserve-tiny's 8 rows at one decode step, rows 0, 2, 4
  and 6 under the long JSON schema after 2, 5, 9 and 14 greedy tokens (so each is at another
  place in the grammar), the others free. Each cell is one int32 word of the mask, 32 token ids:
  coloured when the word allows at least one id, pale when it allows none. Free rows have no
  mask at all (drawn white). The words come from the real matchers of a real generation;
  nothing is timed.
- ``apply-cost.png``: applying 4 rows' masks to (8, V) logits at three vocabulary sizes,
  PyTorch's unpack against the C++ op, best of 50 interleaved tries each, measured when the
  figure is drawn (so its bars belong to the machine that drew it, named in the title).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from chapters.day68_mask_in_batch.claims import CONSTRAINED, ROWS, llm  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

STEPS_BEFORE = (2, 5, 9, 14)  # tokens each constrained row has when the mask is drawn


def batch_words() -> tuple[np.ndarray, list[int], list[str]]:
    """(ROWS, W): which words allow anything, for the constrained rows after STEPS_BEFORE
    tokens; the constrained row indices; each constrained row's text so far."""
    from nanoserve import SamplingParams
    from nanoserve.bench.structured import LONG_SCHEMA
    from nanoserve.structured.mask import fill
    from nanoserve.structured.params import StructuredOutputsParams

    spec = StructuredOutputsParams(json=LONG_SCHEMA)
    rows = list(range(0, ROWS, ROWS // CONSTRAINED))
    prompts = [f"Record {i} as JSON:" for i in rows]
    outs = llm().generate(prompts, [SamplingParams(max_tokens=n, temperature=0,
                                                   structured_outputs=spec)
                                    for n in STEPS_BEFORE])
    V = llm().core.vocab_size
    grid = np.zeros((ROWS, -(-V // 32)), dtype=int)  # 0: free row, 1: no id, 2: some ids
    texts = []
    for r, out in zip(rows, outs, strict=True):
        m = llm().core.grammars().matcher(spec)
        m.consume_tokens(list(out.token_ids))
        words = fill([m], V)[0]
        grid[r] = np.where(words.numpy() != 0, 2, 1)
        texts.append(out.text)
    return grid, rows, texts


def draw_mask(ax, grid: np.ndarray, rows: list[int], texts: list[str]) -> None:
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([COLORS["paper"], COLORS["muted"], COLORS["highlight"]])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
    ax.set_yticks(range(grid.shape[0]))
    ax.set_yticklabels([f"row {i}" + (" (grammar)" if i in rows else " (free)")
                        for i in range(grid.shape[0])], fontsize=8.5)
    ax.set_xlabel(f"mask word (32 token ids each, {grid.shape[1]} words)")
    ax.grid(False)
    for r, text in zip(rows, texts, strict=True):
        allowed = int((grid[r] == 2).sum())
        words = "word allows" if allowed == 1 else "words allow"
        ax.text(grid.shape[1] * 0.98, r, f"{text!r}: {allowed} {words} an id",
                ha="right", va="center", fontsize=7.5, color=COLORS["ink"],
                bbox=dict(facecolor=COLORS["paper"], edgecolor="none", pad=1.5))
    ax.set_title("One step's mask: four rows at four places in one grammar, four free rows",
                 fontsize=11, loc="left")


def draw_cost(ax, costs: list[dict], cpu: str) -> None:
    sizes = [f"{c['vocab']:,}" for c in costs]
    x = np.arange(len(costs))
    ax.bar(x - 0.2, [c["torch_us"] for c in costs], 0.4, color=COLORS["reference"],
           label="PyTorch: unpack, mask a copy of the rows")
    if all("op_us" in c for c in costs):
        ax.bar(x + 0.2, [c["op_us"] for c in costs], 0.4, color=COLORS["compute"],
               label="C++ op: one pass over the words, in place")
    ax.set_xticks(x)
    ax.set_xticklabels(sizes)
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary size")
    ax.set_ylabel("microseconds, logits copy included")
    ax.legend(fontsize=8.5, loc="upper left")
    ax.set_title(f"4 rows' masks on (8, V) logits\n{cpu}", fontsize=10, loc="left")


if __name__ == "__main__":
    from nanoserve.bench.hardware import cpu_model
    from nanoserve.bench.structured import apply_costs

    grid, rows, texts = batch_words()
    fig, ax = figure(width=11, height=3.8)
    draw_mask(ax, grid, rows, texts)
    fig.tight_layout()
    save(fig, __file__, "batch-mask")

    fig, ax = figure(width=7, height=4)
    draw_cost(ax, apply_costs([2048, 32768, 131072], ROWS, CONSTRAINED), cpu_model())
    fig.tight_layout()
    save(fig, __file__, "apply-cost")
