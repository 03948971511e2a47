"""Day 42's figure: how each budget cuts one long prompt arriving among seven streams.

    python chapters/day42_budget_measured/diagram.py

writes build/figures/day42_budget_measured/budget-steps.png. For each arm (chunked prefill
off; budgets 512, 256, 128 and 64), the tokens of every step from the moment the workload's first
768-id prompt arrives to the step that gives it its first token: the seven running streams' decode
tokens and the long prompt's chunk. The steps come from the live Scheduler with no model
(``claims.long_prompt_steps``), so the figure involves no clock and no server. A stream waits
for the whole of each step, so the height of the tallest bar is what its worst gap pays for.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day42_budget_measured.claims import ARMS, steps  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

LABELS = {"off": "chunking off (whole prompt, separate forwards)", "512": "budget 512 (default)",
          "256": "budget 256", "128": "budget 128", "64": "budget 64"}


def main() -> None:
    chunks = steps()
    longest = max(len(c) for c in chunks.values())
    fig, axes = figure(width=10, height=8.6, nrows=len(ARMS), sharex=True, sharey=True,
                       gridspec_kw={"hspace": 0.55})
    for ax, arm in zip(axes, ARMS, strict=True):
        xs = list(range(1, len(chunks[arm]) + 1))
        ax.bar(xs, [6] * len(xs), bottom=1, color=COLORS["highlight"],
               label="7 streams' decode tokens")
        ax.bar(xs, chunks[arm], bottom=[7] * len(xs), color=COLORS["compute"],
               label="the long prompt's chunk")
        for x, n in zip(xs, chunks[arm], strict=True):
            ax.text(x, (7 + n) * 1.15, f"7+{n}", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{LABELS[arm]}: {len(xs)} step{'s' if len(xs) > 1 else ''}",
                     fontsize=10.5, loc="left")
        ax.set_yscale("log")
        ax.set_ylim(1, 3000)
        ax.set_ylabel("tokens (log)")
    axes[0].legend(loc="upper right", fontsize=9)
    axes[-1].set_xticks(range(1, longest + 1))
    axes[-1].set_xlabel("step, counted from the one that admits the 768-id prompt")
    fig.suptitle("Day 42: one 768-id prompt arriving among seven streams, cut by each budget",
                 fontsize=12, fontweight="bold", y=0.99)
    save(fig, __file__, "budget-steps")


if __name__ == "__main__":
    main()
