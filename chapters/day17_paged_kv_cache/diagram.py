"""Day 17's figures: how a token finds its cell, and the rectangle attention reads.

    .venv/bin/python chapters/day17_paged_kv_cache/diagram.py

writes build/figures/day17_paged_kv_cache/addressing.png and rectangle.png.

The example is the notebook's: an 8-block pool with block_size 4. An earlier request X held
blocks 0-2; A (10 tokens) took 3 and 4, B (7 tokens) took 5; X finished; A grew into block 0 and
B into block 1. So A's block table is [3, 4, 0] and B's is [5, 1]. Every cell number in the
figures comes from the frozen Day 14 allocator and Day 17 BlockTable, not from hand.

addressing: block tables (host) -> the pool (blocks scattered, out of order) -> the slot table
(device), with token 9 of A followed all the way through.

rectangle: one decode step for both rows (A at position 10, B at 7). read_cells is
slots[rows, :S] with S = 11, the longer context; B's last three columns are -1, gathered from
cell 0 after clamping, and masked.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator  # noqa: E402
from chapters.day17_paged_kv_cache.snapshot.paged import BlockTable  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

BS, NUM_BLOCKS, MAX_LEN = 4, 8, 16
LENGTHS = {"A": 10, "B": 7}
SHADE = {"A": COLORS["compute"], "B": COLORS["memory"]}
FOLLOW = ("A", 9)  # the token the first figure follows


def history() -> dict[str, BlockTable]:
    """The allocation history of the notebook, replayed on the frozen allocator."""
    pool = BlockAllocator(NUM_BLOCKS, BS)
    tables = {name: BlockTable(BS, MAX_LEN // BS) for name in LENGTHS}
    x = pool.allocate(3)                                   # an earlier request X
    tables["A"].extend(pool.allocate(2))                   # A's first 8 tokens
    tables["B"].extend(pool.allocate(1))                   # B's first 4 tokens
    pool.free(x)                                           # X finishes
    tables["A"].extend(pool.allocate(1))                   # A grows past 8 tokens
    tables["B"].extend(pool.allocate(1))                   # B grows past 4 tokens
    pool.check_invariants()
    return tables


def cell_box(ax, x, y, w, h, text, face, *, text_color="white", size=9, hatch=None, lw=0.6,
             edge=None):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor=edge or COLORS["ink"], lw=lw,
                           hatch=hatch))
    backing = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"}
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
            color=text_color, bbox=backing if hatch else None)


def arrow(ax, start, end, color=COLORS["ink"], lw=1.0, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, color=color,
                                 lw=lw, connectionstyle=f"arc3,rad={rad}"))


def addressing() -> None:
    tables = history()
    owner = {}  # cell -> (name, position)
    for name, t in tables.items():
        for p, c in enumerate(t.cells(0, LENGTHS[name])):
            owner[c] = (name, p)
    fname, fpos = FOLLOW
    fblock_index, foffset = fpos // BS, fpos % BS
    fblock = tables[fname].blocks[fblock_index]
    fcell = fblock * BS + foffset

    fig, ax = figure(width=11, height=7.6)
    ax.set_axis_off()
    ax.set_xlim(-0.2, 17.2)
    ax.set_ylim(0.4, 11.6)

    # Left: the block tables (host).
    ax.text(0, 11.2, "Block tables (host, Python lists)", fontsize=11.5, fontweight="bold")
    table_box = {}
    for r, (name, t) in enumerate(tables.items()):
        y = 10.0 - r * 2.6
        ax.text(0, y + 0.35, f"{name}: {LENGTHS[name]} tokens", fontsize=10, va="center")
        for i, b in enumerate(t.blocks):
            x = 2.3 + i * 0.9
            hl = name == fname and i == fblock_index
            cell_box(ax, x, y, 0.8, 0.7, str(b), COLORS["highlight"] if hl else SHADE[name],
                     size=11)
            ax.text(x + 0.4, y - 0.18, f"[{i}]", ha="center", va="top", fontsize=7.5,
                    color=COLORS["reference"])
            table_box[(name, i)] = (x + 0.78, y + 0.04)

    # Middle/right: the pool, one row of BS cells per block.
    px, py0, cw, ch = 8.6, 10.4, 1.2, 0.72
    ax.text(px - 1.4, 11.2, f"Pool: {NUM_BLOCKS} blocks x {BS} cells, shared by all rows "
            "(one layer's k shown)", fontsize=11.5, fontweight="bold")
    pool_row = {}
    for b in range(NUM_BLOCKS):
        y = py0 - (b + 1) * 0.92
        ax.text(px - 0.15, y + ch / 2, f"block {b}", ha="right", va="center", fontsize=9.5)
        pool_row[b] = (px - 1.4, y + ch / 2)
        for o in range(BS):
            c = b * BS + o
            who = owner.get(c)
            if who:
                label, face, tc = f"{who[0]}{who[1]}", SHADE[who[0]], "white"
            else:
                label, face, tc = "free", COLORS["muted"], COLORS["reference"]
            if c == fcell:
                face = COLORS["highlight"]
            cell_box(ax, px + o * cw, y, cw - 0.08, ch, label, face, text_color=tc, size=9.5)
            ax.text(px + o * cw + 0.06, y + ch - 0.06, str(c), fontsize=6.5, va="top",
                    color="white" if who else COLORS["reference"])
    ax.text(px + BS * cw + 0.15, py0 - 0.92 * 2,
            "blocks 0-2 were X's:\nA and B grew into\n0 and 1 after it\nfinished; 2 is free",
            fontsize=8.5, va="center", color=COLORS["reference"])

    # Arrows: block table entry -> pool row.
    for (name, i), start in table_box.items():
        b = tables[name].blocks[i]
        hl = name == fname and i == fblock_index
        arrow(ax, start, pool_row[b], color=COLORS["highlight"] if hl else SHADE[name],
              lw=1.8 if hl else 0.9, rad=-0.12)

    # The worked example.
    ax.text(0, 5.45, f"Token {fpos} of {fname}:\n"
            f"  block index  {fpos} // {BS} = {fblock_index} -> block {fblock}\n"
            f"  offset       {fpos} % {BS} = {foffset}\n"
            f"  cell         {fblock} * {BS} + {foffset} = {fcell}\n"
            f"  slot table   row 0, position {fpos}: {fcell}",
            fontsize=10, family="DejaVu Sans Mono", va="top",
            bbox={"boxstyle": "round,pad=0.4", "facecolor": "#fdf3e1",
                  "edgecolor": COLORS["highlight"]})

    # Bottom: the slot table (device), one row per batch row.
    sx, sw = 2.3, 0.92
    ax.text(0, 2.75, f"Slot table (device): ({len(tables)}, max_model_len = {MAX_LEN}) int64, "
            "the cell of every position", fontsize=11.5, fontweight="bold")
    for r, (name, t) in enumerate(tables.items()):
        y = 1.55 - r * 1.0
        ax.text(0, y + 0.32, f"row {r} ({name})", fontsize=10, va="center")
        cells = t.cells(0, LENGTHS[name])
        for p in range(MAX_LEN):
            if p < len(cells):
                c = cells[p]
                face = COLORS["highlight"] if (name, p) == FOLLOW else SHADE[name]
                cell_box(ax, sx + p * sw, y, sw - 0.06, 0.64, str(c), face, size=9.5)
            else:
                cell_box(ax, sx + p * sw, y, sw - 0.06, 0.64, "-1", COLORS["muted"],
                         text_color=COLORS["reference"], size=9)
    for p in range(MAX_LEN):
        ax.text(sx + p * sw + (sw - 0.06) / 2, 1.55 + 0.72, str(p), ha="center", va="bottom",
                fontsize=7.5, color=COLORS["reference"])
    ax.text(sx + MAX_LEN * sw + 0.1, 1.55 + 0.72, "token position", ha="left", va="bottom",
            fontsize=7.5, color=COLORS["reference"])
    save(fig, __file__, "addressing")


def rectangle() -> None:
    tables = history()
    rows = list(tables)
    ctx = {name: LENGTHS[name] + 1 for name in rows}  # one decode step each
    S = max(ctx.values())
    fig, ax = figure(width=11, height=4.3)
    ax.set_axis_off()
    ax.set_xlim(-0.2, 14.6)
    ax.set_ylim(-1.75, 3.1)
    ax.text(0, 2.8, f"One decode step for rows A and B: read_cells = slots[rows, :S], "
            f"S = {S} (the longer context)", fontsize=11.5, fontweight="bold")
    x0, w = 2.6, 0.98
    for r, name in enumerate(rows):
        y = 1.2 - r * 1.15
        t = tables[name]
        cells = t.cells(0, ctx[name])
        ax.text(0, y + 0.36, f"row {r} ({name})\ncontext {ctx[name]}", fontsize=10,
                va="center")
        for j in range(S):
            if j < len(cells):
                new = j == ctx[name] - 1
                face = COLORS["highlight"] if new else SHADE[name]
                cell_box(ax, x0 + j * w, y, w - 0.06, 0.72, str(cells[j]), face, size=10)
            else:
                cell_box(ax, x0 + j * w, y, w - 0.06, 0.72, "-1 → 0", "#f6d3d8",
                         text_color=COLORS["ink"], size=9, hatch="///", edge=COLORS["waste"])
        ax.text(x0 + S * w + 0.15, y + 0.36,
                "all visible" if ctx[name] == S else f"{S - ctx[name]} columns masked:\n"
                f"key j visible iff j < {ctx[name]}", fontsize=9, va="center")
    for j in range(S):
        ax.text(x0 + j * w + (w - 0.06) / 2, 1.2 + 0.8, str(j), ha="center", va="bottom",
                fontsize=8, color=COLORS["reference"])
    writes = [[tables[n].cells(ctx[n] - 1, ctx[n])[0]] for n in rows]
    ax.text(0, -0.95, f"write_cells = {writes}   # (B, T): the new K/V land here first\n"
            "keys = k_pool[read_cells.clamp(min=0)]   # (B, S, Hkv, D) -> (B, Hkv, S, D)\n"
            "mask = (j <= q_position) & (j < context_len)   # (B, T, S), T = 1 here",
            fontsize=9.5, family="DejaVu Sans Mono", va="center")
    ax.text(x0 + 8 * w, -0.08, "cell 0 holds A's token 8: B gathers it and gives it weight 0",
            fontsize=8.5, color=COLORS["waste"], va="center")
    handles = [Patch(color=COLORS["compute"], label="A's cells"),
               Patch(color=COLORS["memory"], label="B's cells"),
               Patch(color=COLORS["highlight"], label="written this step"),
               Patch(facecolor="#f6d3d8", hatch="///", edgecolor=COLORS["waste"],
                     label="gathered, then masked")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.02), ncol=4,
              fontsize=9, handlelength=1.6)
    save(fig, __file__, "rectangle")


if __name__ == "__main__":
    addressing()
    rectangle()
