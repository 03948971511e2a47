"""Day 60's figure: what the reference reads against what the kernel's programs read.

    python chapters/day60_paged_kernel/diagram.py

writes build/figures/day60_paged_kernel/program-grid.png: three rows of 5, 14 and 9 tokens in
4-token blocks scattered over a pool. Top: the reference's (B, S) rectangle, every row gathered
at the longest row's width and the excess masked. Middle: the kernel's grid, one program per
(row, KV head), each walking only its own row's blocks (labelled by block id) in 8-token tiles
(small, for the drawing; the engine's tile is 64), the GQA query heads packed into the
program. Bottom: the pool, each cell coloured by the row that owns it. The cells are computed by
the frozen snapshot's ``cells_of``; nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib import colormaps  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day60_paged_kernel.snapshot.online import cells_of  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

LENS = (5, 14, 9)
BLOCK, TILE, KV_HEADS, GROUP = 4, 8, 2, 4
TABLES = ([6, 1], [3, 9, 0, 7], [2, 8, 5])  # each row's block ids, scattered, out of order
POOL_BLOCKS = 10


def main() -> None:
    palette = [colormaps["tab10"](i) for i in (0, 2, 4)]
    S = max(LENS)
    fig, axes = figure(width=12, height=8.4, nrows=3,
                       gridspec_kw={"height_ratios": [3, 6, 1.6]})
    ref, grid, pool = axes

    for r, n in enumerate(LENS):  # the rectangle
        for p in range(S):
            used = p < n
            ref.add_patch(Rectangle((p, r), 0.92, 0.8, facecolor=palette[r] if used
                                    else COLORS["waste"], alpha=1.0 if used else 0.35,
                                    edgecolor="none"))
        ref.text(S + 0.3, r + 0.4, f"row {r}: needs {n}, gathers {S}", va="center", fontsize=9)
    ref.set_xlim(0, S + 5)
    ref.set_ylim(len(LENS), -0.2)
    ref.set_yticks([])
    ref.set_xticks(range(0, S + 1, 2))
    ref.grid(False)
    ref.set_title(f"reference: a ({len(LENS)}, {S}) rectangle of cells, K and V copied at that "
                  "width, scores for every position, then the mask (red)", fontsize=10.5,
                  loc="left")

    y = 0
    for r, n in enumerate(LENS):  # the programs
        cells = cells_of(TABLES[r], n, BLOCK)
        for h in range(KV_HEADS):
            for p in range(n):
                grid.add_patch(Rectangle((p, y + 0.1), 0.92, 0.8, facecolor=palette[r],
                                         edgecolor="none"))
                grid.text(p + 0.46, y + 0.5, str(cells[p]), ha="center", va="center",
                          fontsize=6.5, color=COLORS["paper"])
            for b in range(-(-n // BLOCK)):
                grid.text(b * BLOCK + 0.1, y - 0.02, f"block {TABLES[r][b]}", fontsize=6.5,
                          va="bottom", color=COLORS["ink"])
            for t in range(0, n, TILE):  # the tiles the program's loop visits
                grid.add_patch(Rectangle((t - 0.05, y + 0.02), min(TILE, n - t) + 0.02, 0.96,
                                         fill=False, edgecolor=COLORS["highlight"],
                                         linewidth=1.8))
            grid.text(S + 0.3, y + 0.5, f"program ({r}, {h}): query heads "
                      f"{h * GROUP}-{h * GROUP + GROUP - 1} share KV head {h}",
                      va="center", fontsize=8.5)
            y += 1.35
    grid.set_xlim(0, S + 5)
    grid.set_ylim(y, -0.5)
    grid.set_yticks([])
    grid.set_xticks(range(0, S + 1, 2))
    grid.set_xlabel("context position (numbers: the pool cell, blocks[p // 4] * 4 + p % 4)")
    grid.grid(False)
    grid.set_title(f"kernel: a grid of {len(LENS)} rows × {KV_HEADS} KV heads = "
                   f"{len(LENS) * KV_HEADS} programs; each walks its own row in tiles "
                   f"(orange), nothing wider", fontsize=10.5, loc="left")

    owner = {b: r for r, t in enumerate(TABLES) for b in t}
    for b in range(POOL_BLOCKS):  # the pool
        for o in range(BLOCK):
            c = b * BLOCK + o
            r = owner.get(b)
            held = r is not None and o + TABLES[r].index(b) * BLOCK < LENS[r]
            pool.add_patch(Rectangle((c, 0), 0.92, 0.8, edgecolor="none",
                                     facecolor=palette[r] if held else COLORS["muted"]))
        pool.text(b * BLOCK + BLOCK / 2, 0.95, f"block {b}", ha="center", fontsize=7.5)
    pool.set_xlim(0, POOL_BLOCKS * BLOCK)
    pool.set_ylim(1.4, -0.1)
    pool.set_yticks([])
    pool.set_xlabel("pool cell")
    pool.grid(False)
    pool.set_title("the pool: where the cells live (grey: owned by no row)", fontsize=10.5,
                   loc="left")
    fig.legend(handles=[*(Patch(color=palette[r], label=f"row {r}") for r in range(len(LENS))),
                        Patch(color=COLORS["waste"], alpha=0.35, label="gathered, then masked")],
               loc="lower center", ncols=4, fontsize=9, bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("The paged decode kernel reads each row through its own block ids",
                 fontsize=12.5, fontweight="bold")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, __file__, "program-grid")


if __name__ == "__main__":
    main()
