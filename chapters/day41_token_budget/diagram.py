"""Day 41's figure: what each step computes, with a token budget and without one.

    python chapters/day41_token_budget/diagram.py

writes build/figures/day41_token_budget/token-budget.png: the chapter's worked workload (four
requests with 3-token prompts and 8 tokens each from step 1, a 40-token prompt wanting 3 tokens
from step 2; block_size 4, a 64-block pool, 8 slots), scheduled by the frozen Day 41 snapshot
over integer tokens. Each bar is one step, split into decode tokens and prompt (prefill) tokens;
left at a budget of 16 tokens per step with chunked prefill, right with no budget, whole prompts.
A star marks the step that gives the 40-token prompt its first token. Nothing is timed and no
model is loaded; the claims show the package's scheduler gives the same steps.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chapters.day41_token_budget.claims import BUDGET, first_token_step, worked  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def panel(ax, steps, title: str, budget: int | None) -> None:
    x = range(1, len(steps) + 1)
    decode = [s.decode_tokens for s in steps]
    prefill = [s.prefill_tokens for s in steps]
    ax.bar(x, decode, color=COLORS["compute"], width=0.7)
    ax.bar(x, prefill, bottom=decode, color=COLORS["highlight"], width=0.7)
    for i, s in zip(x, steps, strict=True):
        ax.text(i, s.tokens + 0.8, str(s.tokens), ha="center", va="bottom", fontsize=10,
                fontweight="bold")
        for rid, start, n in s.chunks:
            if rid == "long":
                ax.text(i, s.decode_tokens + n / 2, f"{start}..{start + n - 1}", ha="center",
                        va="center", fontsize=7.5, color=COLORS["ink"],
                        rotation=90 if n >= 8 else 0)
    first = first_token_step(steps)
    ax.plot(first, steps[first - 1].tokens + 5.5, marker="*", markersize=14,
            color=COLORS["waste"])
    if budget is not None:
        ax.axhline(budget, color=COLORS["waste"], linestyle="--", linewidth=1.2)
        ax.text(len(steps) + 0.45, budget + 0.6, f"budget {budget}", ha="right", va="bottom",
                fontsize=9, color=COLORS["waste"])
    ax.set_xticks(list(x))
    ax.set_xlabel("step (one schedule() call and the engine step after it)")
    ax.set_title(title, fontsize=11, loc="left")


def main() -> None:
    chunked, whole = worked("snapshot"), worked("snapshot", None)
    fig, (left, right) = figure(width=11, height=4.8, ncols=2, sharey=True)
    panel(left, chunked, f"max_num_batched_tokens={BUDGET}, chunked prefill", BUDGET)
    panel(right, whole, "no budget: whole prompts, as before today", None)
    left.set_ylabel("tokens computed in the step")
    left.set_ylim(0, max(s.tokens for s in whole) + 10)
    fig.legend(handles=[
        Patch(color=COLORS["compute"], label="decode tokens (one per running request)"),
        Patch(color=COLORS["highlight"], label="prompt tokens (the labels: the 40-token "
                                                "prompt's positions)"),
        Line2D([], [], marker="*", color=COLORS["waste"], linestyle="none", markersize=12,
               label="the 40-token prompt's first token")],
        loc="lower center", ncols=3, fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Day 41: a step spends a token budget, decodes first; the long prompt is cut "
                 "into chunks", fontsize=12.5, fontweight="bold")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, __file__, "token-budget")


if __name__ == "__main__":
    main()
