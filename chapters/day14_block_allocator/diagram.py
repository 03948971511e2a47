"""Day 14's figures: what a ragged batch costs contiguous and paged, and a free list at work.

    .venv/bin/python chapters/day14_block_allocator/diagram.py

writes build/figures/day14_block_allocator/ragged-batch.png and free-list.png.

ragged-batch: the eight sequences of the chapter's claims (lengths 37 ... 5, max_model_len 1024,
block_size 16) as horizontal bars. Top, a contiguous cache: every sequence reserves 1,024
positions. Bottom, paging: every sequence holds ceil(n / 16) blocks, and only the tail of its last
block is unused. The blocks come from the frozen Day 14 allocator, as in claims.py.

free-list: a 12-block pool through six operations, one row per state, each block coloured by the
sequence holding it. It shows the lowest-id-first rule and how a sequence's blocks stop being
adjacent once others have come and gone.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from matplotlib.patches import Patch, Rectangle  # noqa: E402

from chapters.day14_block_allocator.claims import (  # noqa: E402
    BLOCK_SIZE,
    LENGTHS,
    MAX_MODEL_LEN,
    paged_blocks,
)
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def ragged_batch() -> None:
    held = paged_blocks()
    n_seq = len(LENGTHS)
    fig, (top, bottom) = figure(width=10, height=7.4, nrows=2, sharex=True,
                                gridspec_kw={"hspace": 0.42})
    for ax in (top, bottom):
        ax.set_ylim(-0.6, n_seq - 0.4)
        ax.invert_yaxis()
        ax.set_yticks(range(n_seq))
        ax.set_yticklabels([f"seq {i}: {n:,} tok" for i, n in enumerate(LENGTHS)], fontsize=9.5)
        ax.grid(False)
        ax.set_xlim(0, MAX_MODEL_LEN * 1.135)
        ax.spines["left"].set_visible(False)
        ax.tick_params(axis="y", length=0)

    # Contiguous: tokens, then the reserved-but-unused rest of the max-length row.
    for i, n in enumerate(LENGTHS):
        top.barh(i, n, color=COLORS["memory"], height=0.62, edgecolor=COLORS["ink"], lw=0.5)
        top.barh(i, MAX_MODEL_LEN - n, left=n, color=COLORS["waste"], alpha=0.55, height=0.62,
                 edgecolor=COLORS["ink"], lw=0.5)
        top.text(MAX_MODEL_LEN + 12, i, f"{MAX_MODEL_LEN - n:,} unused", va="center",
                 fontsize=8.5, color=COLORS["waste"])
    used = sum(LENGTHS)
    reserved = n_seq * MAX_MODEL_LEN
    top.set_title(f"Contiguous: {n_seq} × {MAX_MODEL_LEN:,} = {reserved:,} positions reserved "
                  f"for {used:,} tokens ({used / reserved:.1%} used)", fontsize=11.5, loc="left")

    # Paged: one rectangle per block; the token part green, the unused tail red.
    for i, (n, blocks) in enumerate(zip(LENGTHS, held, strict=True)):
        for k in range(len(blocks)):
            x0 = k * BLOCK_SIZE
            fill = min(BLOCK_SIZE, n - x0)
            bottom.add_patch(Rectangle((x0, i - 0.31), fill, 0.62, facecolor=COLORS["memory"],
                                       edgecolor="none"))
            if fill < BLOCK_SIZE:
                bottom.add_patch(Rectangle((x0 + fill, i - 0.31), BLOCK_SIZE - fill, 0.62,
                                           facecolor=COLORS["waste"], edgecolor="none"))
            bottom.add_patch(Rectangle((x0, i - 0.31), BLOCK_SIZE, 0.62, facecolor="none",
                                       edgecolor="white", lw=0.35))
        end = len(blocks) * BLOCK_SIZE
        bottom.add_patch(Rectangle((0, i - 0.31), end, 0.62, facecolor="none",
                                   edgecolor=COLORS["ink"], lw=0.5))
        tail = end - n
        noun = "block" if len(blocks) == 1 else "blocks"
        bottom.text(end + 12, i, f"{len(blocks)} {noun}, tail {tail}", va="center",
                    fontsize=8.5, color=COLORS["waste"] if tail else COLORS["ink"])
    slots = sum(len(b) for b in held) * BLOCK_SIZE
    bottom.set_title(f"Paged (block_size {BLOCK_SIZE}): {sum(len(b) for b in held)} blocks = "
                     f"{slots:,} positions for {used:,} tokens ({slots - used} unused)",
                     fontsize=11.5, loc="left")
    bottom.set_xlabel("token positions")
    bottom.set_xticks([0, 256, 512, 768, 1024])
    bottom.xaxis.set_tick_params(labelbottom=True)
    top.xaxis.set_tick_params(labelbottom=True)
    top.set_xlabel("token positions")

    handles = [Patch(color=COLORS["memory"], label="holds a token"),
               Patch(color=COLORS["waste"], alpha=0.7, label="held but unused")]
    fig.legend(handles=handles, loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.01),
               fontsize=10)
    fig.suptitle("The same ragged batch, reserved contiguously and held in blocks",
                 fontsize=13, fontweight="bold", y=0.99)
    save(fig, __file__, "ragged-batch")


def free_list() -> None:
    """Replay a short history on a 12-block pool and draw who holds what after each step."""
    pool = BlockAllocator(num_blocks=12, block_size=16)
    owner: dict[int, str] = {}
    held: dict[str, list[int]] = {}
    states: list[tuple[str, dict[int, str]]] = [("new pool: all 12 blocks free", dict(owner))]

    def alloc(name: str, n: int, verb: str = "arrives") -> None:
        got = pool.allocate(n)
        held.setdefault(name, []).extend(got)
        owner.update(dict.fromkeys(got, name))
        pool.check_invariants()
        states.append((f"{name} {verb}: allocate({n}) -> {got}", dict(owner)))

    def free(name: str) -> None:
        blocks = held.pop(name)
        pool.free(blocks)
        for b in blocks:
            del owner[b]
        pool.check_invariants()
        states.append((f"{name} finishes: free({blocks})", dict(owner)))

    alloc("A", 3)
    alloc("B", 4)
    alloc("C", 2)
    free("B")
    alloc("D", 5)
    alloc("A", 1, "grows")

    colours = {"A": COLORS["compute"], "B": COLORS["highlight"], "C": COLORS["memory"],
               "D": "#8e6bb8"}
    fig, ax = figure(width=10, height=4.6)
    ax.grid(False)
    for r, (label, state) in enumerate(states):
        for b in range(pool.num_blocks):
            who = state.get(b)
            ax.add_patch(Rectangle((b, r), 0.92, 0.8, facecolor=colours[who] if who else
                                   COLORS["muted"], edgecolor=COLORS["ink"], lw=0.5))
            ax.text(b + 0.46, r + 0.4, who or str(b), ha="center", va="center", fontsize=9,
                    color="white" if who else COLORS["reference"],
                    fontweight="bold" if who else "normal")
        free_now = pool.num_blocks - len(state)
        ax.text(12.25, r + 0.4, f"{label}   ({free_now} free)", va="center", fontsize=9.5)
    ax.set_xlim(-0.1, 22.5)
    ax.set_ylim(len(states) + 0.05, -0.25)
    ax.set_xticks([b + 0.46 for b in range(pool.num_blocks)])
    ax.set_xticklabels([str(b) for b in range(pool.num_blocks)], fontsize=9)
    ax.set_xlabel("block id")
    ax.set_yticks([])
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="x", length=0)
    ax.set_title("A 12-block pool, lowest free id first: D and A end up holding scattered blocks",
                 fontsize=11.5, loc="left")
    save(fig, __file__, "free-list")


if __name__ == "__main__":
    ragged_batch()
    free_list()
