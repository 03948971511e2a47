"""Day 43's figure: four requests sharing blocks, their reference counts, and what is evicted.

    .venv/bin/python chapters/day43_prefix_caching/diagram.py

writes build/figures/day43_prefix_caching/shared-blocks.png.

Everything is the frozen Day 43 pool (``snapshot/prefix_cache.py``) driven by hand, block_size 4,
a 12-block pool, no model: four prompts admitted in one step, in order. R0 is 17 tokens; R1
shares its first 12 (three blocks); R2 shares only its first 8; R3 is R0 again, token for token.
Each is matched against the map, takes its hits, gets fresh blocks for the rest, and registers
its full blocks at once (``commit_blocks``), so the next one can hit them in the same step.

Top: each request's block table, hits in green, computed blocks in blue, the unfilled last
block pale; the text beside each row says how many prompt tokens it computes. Middle: the pool
after that step, every block's holders. Bottom: the pool after R1, R0, R2 and R3 have finished
in that order: every block free, the cached ones numbered in the order they would be evicted
(least recently freed first, a request's tail before its head), and the blocks a newcomer of
32 unrelated tokens takes: the six never-cached ones (unfilled last blocks are never cached),
then the two oldest cached. The shared head is evicted last: it was freed last.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day43_prefix_caching.snapshot.prefix_cache import (  # noqa: E402
    CachingBlockAllocator,
    commit_blocks,
    match_prefix,
)
from diagrams import COLORS, figure, save  # noqa: E402

BS, POOL = 4, 12
NEWCOMER = 32  # tokens of a later, unrelated prompt: 8 blocks
HEAD = list(range(100, 112))  # the 12 shared tokens
PROMPTS = {
    "R0": HEAD + [200, 201, 202, 203, 204],
    "R1": HEAD + [300, 301, 302, 303, 304, 305],
    "R2": HEAD[:8] + [400, 401, 402, 403, 404, 405, 406],
}
PROMPTS["R3"] = list(PROMPTS["R0"])  # identical to R0
PALE = "#b9cde6"


class Req:
    """The fields match_prefix and commit_blocks read: a request, minus everything else."""

    def __init__(self, token_ids):
        self.token_ids = token_ids
        self.blocks: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_computed_tokens = self.num_cached_blocks = 0


def admit(pool: CachingBlockAllocator, r: Req) -> list[int]:
    """The scheduler's admission, reduced: hit, take, allocate the rest, register at once."""
    hit = match_prefix(pool, r)
    pool.take(hit)
    need = pool.blocks_for_length(len(r.token_ids)) - len(hit)
    r.blocks = hit + pool.allocate(need)
    r.num_computed_tokens, r.num_cached_blocks = len(r.token_ids), len(hit)
    commit_blocks(pool, r)
    return hit


def simulate():
    pool = CachingBlockAllocator(POOL, BS)
    reqs = {name: Req(ids) for name, ids in PROMPTS.items()}
    hits = {name: admit(pool, r) for name, r in reqs.items()}
    refs = {b: sum(b in r.blocks for r in reqs.values()) for b in range(POOL)}
    pool.check_invariants()
    for name in ("R1", "R0", "R2", "R3"):
        pool.free(reqs[name].blocks)
    order = list(pool._evictable)  # the figure shows the LRU itself; the chapter's claims
    pool.check_invariants()        # read it only through what allocate() returns
    newcomer = pool.allocate(pool.blocks_for_length(NEWCOMER))
    return reqs, hits, refs, order, newcomer


def draw() -> None:
    reqs, hits, refs, order, newcomer = simulate()
    fig, ax = figure(width=10.5, height=6.6)
    ax.grid(False)
    ax.set_axis_off()
    y = 0.0
    ax.text(-0.1, y - 0.55, "block tables after one step (block_size 4), admitted in order",
            fontsize=11, fontweight="bold")
    for name, r in reqs.items():
        n_hit = len(hits[name])
        for i, b in enumerate(r.blocks):
            filled = min(BS, len(r.token_ids) - i * BS)
            color = (COLORS["memory"] if i < n_hit else
                     COLORS["compute"] if filled == BS else PALE)
            ax.add_patch(Rectangle((i, y), 0.92, 0.78, facecolor=color,
                                   edgecolor=COLORS["ink"], lw=0.6))
            ax.text(i + 0.46, y + 0.39, str(b), ha="center", va="center", fontsize=10,
                    color="white" if color != PALE else COLORS["ink"], fontweight="bold")
        computed = len(r.token_ids) - n_hit * BS
        note = {"R3": "  (identical to R0: the last token is computed)",
                "R2": "  (shares 8 tokens: two blocks)"}.get(name, "")
        ax.text(-0.25, y + 0.39, name, ha="right", va="center", fontsize=10.5)
        ax.text(5.3, y + 0.39, f"{len(r.token_ids)} tokens: {n_hit * BS} hit, {computed} "
                f"computed{note}", va="center", fontsize=9.5)
        y += 1.0

    def strip(y0: float, title: str, label, color) -> None:
        ax.text(-0.1, y0 - 0.25, title, fontsize=11, fontweight="bold")
        for b in range(POOL):
            c = color(b)
            ax.add_patch(Rectangle((b * 0.85, y0 + 0.05), 0.78, 0.7, facecolor=c,
                                   edgecolor=COLORS["ink"], lw=0.6))
            ax.text(b * 0.85 + 0.39, y0 + 0.4, label(b), ha="center", va="center",
                    fontsize=9, color="white" if c not in (COLORS["muted"], PALE)
                    else COLORS["ink"])
            ax.text(b * 0.85 + 0.39, y0 + 0.95, str(b), ha="center", va="center", fontsize=8,
                    color=COLORS["reference"])

    y += 0.6
    strip(y, "the pool after that step: holders of each block",
          lambda b: f"×{refs[b]}" if refs[b] else "free",
          lambda b: COLORS["memory"] if refs[b] > 1 else COLORS["compute"] if refs[b]
          else COLORS["muted"])
    y += 1.7
    rank = {b: i + 1 for i, b in enumerate(order)}
    taken = set(newcomer)
    strip(y, "after R1, R0, R2, R3 finish: all free; cached ones in eviction order",
          lambda b: f"#{rank[b]}" if b in rank else "new",
          lambda b: (COLORS["waste"] if b in rank else COLORS["reference"]) if b in taken
          else COLORS["highlight"] if b in rank else COLORS["muted"])
    ax.text(0, y + 1.45, f"a newcomer of {NEWCOMER} unrelated tokens takes blocks "
            f"{', '.join(map(str, newcomer))}: never-cached first, then the least recently "
            f"freed", fontsize=9.5)
    ax.set_xlim(-1.0, 11.6)
    ax.set_ylim(y + 1.7, -0.8)
    handles = [Patch(color=COLORS["memory"], label="hit: shared, not computed"),
               Patch(color=COLORS["compute"], label="computed, full: registered"),
               Patch(color=PALE, label="computed, not full: never cached"),
               Patch(color=COLORS["highlight"], label="free, cached (evictable)"),
               Patch(color=COLORS["reference"], label="never cached, taken by the newcomer"),
               Patch(color=COLORS["waste"], label="cached, evicted for the newcomer")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Prefix caching: shared blocks are held once, counted once, evicted last",
                 fontsize=13, fontweight="bold", y=0.93)
    save(fig, __file__, "shared-blocks")


if __name__ == "__main__":
    draw()
