"""Day 70 snapshot (frozen): which blocks of a paged request a sliding window can give back.

A layer with a window of ``w`` tokens lets a query at position i see the key at position j
only when i - w < j <= i (transformers' convention: the query itself and the w - 1 keys before
it). Positions live in blocks of ``block_size`` cells, position p in block p // block_size.

Queries only move forward. Once the next position a request will compute is ``next_pos``, every
later query sees nothing at or before next_pos - w, so a block whose last position is there is
never read again: those are the first (next_pos - w + 1) // block_size blocks. The request's
table keeps their places, each now naming a placeholder (the null block), so positions still map
to table entries by p // block_size.

>>> visible_blocks(100, window=64, block_size=16)   # keys 37..100
range(2, 7)
>>> out_of_window(100, window=64, block_size=16)    # last positions 15 and 31: both <= 36
range(0, 2)
>>> give_back([7, 3, 9, 4, 12, 8, 5], out_of_window(100, 64, 16), null=0)
([0, 0, 9, 4, 12, 8, 5], [7, 3])
>>> most_visible(64, 16), most_visible(17, 16), most_visible(1, 16)
(5, 2, 1)
>>> every_layer_windowed([4096] * 32), every_layer_windowed([512] * 5 + [None])
(4096, None)
"""

from __future__ import annotations


def visible_blocks(pos: int, window: int, block_size: int) -> range:
    """The blocks a query at ``pos`` reads: those holding keys max(0, pos - window + 1)..pos."""
    return range(max(0, pos - window + 1) // block_size, pos // block_size + 1)


def out_of_window(next_pos: int, window: int, block_size: int) -> range:
    """The leading blocks no query at ``next_pos`` or later can see."""
    return range(max(0, (next_pos - window + 1) // block_size))


def give_back(table: list[int], gone: range, null: int) -> tuple[list[int], list[int]]:
    """The table with the blocks of ``gone`` replaced by ``null``, and the blocks freed."""
    freed = [table[i] for i in gone if table[i] != null]
    return [null if i in gone else b for i, b in enumerate(table)], freed


def most_visible(window: int, block_size: int) -> int:
    """The most blocks one query can need: w consecutive positions, the first at a block's
    last cell, span ceil((w - 1) / block_size) + 1 blocks."""
    return -(-(window - 1) // block_size) + 1


def every_layer_windowed(windows: list[int | None]) -> int | None:
    """The window to free blocks by: the widest, if every layer has one. One layer that
    attends to everything (None) reads every block, so then nothing can be freed."""
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)
