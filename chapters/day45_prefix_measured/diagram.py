"""Day 45's figure: which prompt tokens a prefix cache can skip in the prefix_repetition load.

    python chapters/day45_prefix_measured/diagram.py

writes build/figures/day45_prefix_measured/prefix-hits.png: the chapter's 16 requests in the
order they are sent (seed 0), each prompt's 544 tokens split into those a full-block cache
(block_size 16) finds already computed and those it must compute, coloured by which of the four
prefixes the request shares. From the frozen workload generator and its cache model
(``snapshot/workload.py``), so no server and no clock are involved. The benchmark's probe sends
the first request's prompt before the timed requests, which is why that request finds its whole
prompt but the last block.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day45_prefix_measured.claims import BLOCK_SIZE, PREFIX, workload  # noqa: E402
from chapters.day45_prefix_measured.snapshot.workload import cached_tokens  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def main() -> None:
    reqs = workload()
    prompts = [r.prompt for r in reqs]
    groups = {}
    for p in prompts:
        groups.setdefault(tuple(p[:PREFIX["prefix_len"]]), len(groups))
    # each request's hits, sent in order after the probe: the running total's increments
    hits, seen = [], 0
    for i in range(len(prompts)):
        total = cached_tokens(prompts[:i + 1], BLOCK_SIZE, warm=[prompts[0]])
        hits.append(total - seen)
        seen = total
    fig, ax = figure(width=10, height=6)
    shades = [COLORS["memory"], COLORS["highlight"], COLORS["reference"], "#8e6bb8"]
    for y, (p, hit) in enumerate(zip(prompts, hits, strict=True)):
        g = groups[tuple(p[:PREFIX["prefix_len"]])]
        ax.barh(y, hit, color=shades[g], edgecolor=COLORS["ink"], linewidth=0.4)
        ax.barh(y, len(p) - hit, left=hit, color=COLORS["compute"], edgecolor=COLORS["ink"],
                linewidth=0.4)
        ax.text(len(p) + 8, y, f"prefix {g + 1}: {len(p) - hit} computed", va="center",
                fontsize=8.5)
    ax.invert_yaxis()
    ax.set_yticks(range(len(prompts)), [f"request {i + 1}" for i in range(len(prompts))],
                  fontsize=8.5)
    ax.set_xlim(0, 760)
    ax.set_xlabel("prompt tokens (coloured: found in the cache, by prefix; blue: computed)")
    computed = sum(len(p) for p in prompts) - sum(hits)
    ax.set_title(f"caching on: {computed:,} of {sum(len(p) for p in prompts):,} prompt tokens "
                 f"computed (block_size {BLOCK_SIZE}, after the probe)", fontsize=10.5,
                 loc="left")
    fig.suptitle("Day 45: 16 requests sharing 4 prefixes of 512 ids, each with its own 32-id "
                 "suffix", fontsize=12, fontweight="bold", y=0.99)
    save(fig, __file__, "prefix-hits")


if __name__ == "__main__":
    main()
