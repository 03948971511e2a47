"""Rank 0's KV-cache bookkeeping, written down so the workers can do exactly the same.

Why this module exists: every rank owns the KV pool of its own heads, but the *addressing* (the
block tables, the slot tables, the lengths, Day 50's gathered mapping) must be the same on all
of them, and only rank 0 runs the scheduler that changes it. Sending the tables whole every step
would cost per token; instead rank 0's cache is a ``MirroredCache``: a ``BatchedPagedKVCache``
that also appends each change to a journal, as small integer records:

    EXTEND row n b1 .. bn   a row's BlockTable grew (a grant, a step's new blocks)
    RESET  row              a row was released (finished, aborted, preempted)
    ADOPT  row n            an empty row took n cached tokens (a prefix-cache hit, Day 43)
    MOVE   src dst          compaction relabelled a row (Day 58)
    DROP   row null n i1 .. in  blocks i1 .. in of a row left every layer's window (Day 70)
    TRUNC  row n            a row forgot its rejected proposals (speculative decoding, Day 76)

The journal travels with the next forward's broadcast (``protocol.py``) and ``replay`` applies
it to a worker's plain cache before that forward, so both caches enter every forward in the
same state; everything the forward itself changes (``begin_step``, graph windows) then follows
from the same call on every rank. The invariant, written as data:

    replay(journal since the last forward) on a worker  ==  rank 0's cache state
"""

from __future__ import annotations

from nanoserve.attention.paged import BatchedPagedKVCache, BlockTable

EXTEND, RESET, ADOPT, MOVE, DROP, TRUNC = 1, 2, 3, 4, 5, 6
OPS = {EXTEND: "extend", RESET: "reset_row", ADOPT: "adopt_prefix", MOVE: "move_row",
       DROP: "drop_blocks", TRUNC: "truncate_row"}


class JournaledBlockTable(BlockTable):
    def __init__(self, block_size: int, capacity: int, row: int, journal: list[int]):
        super().__init__(block_size, capacity)
        self.row, self.journal = row, journal

    def extend(self, blocks: list[int]) -> None:
        super().extend(blocks)  # refused before it is written down
        if blocks:
            self.journal += [EXTEND, self.row, len(blocks), *blocks]


class MirroredCache(BatchedPagedKVCache):
    """A ``BatchedPagedKVCache`` whose addressing changes are journaled for the workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.journal: list[int] = []
        self.tables = [JournaledBlockTable(t.block_size, t.capacity, row, self.journal)
                       for row, t in enumerate(self.tables)]

    def reset_row(self, row: int) -> list[int]:
        blocks = super().reset_row(row)
        self.journal += [RESET, row]
        return blocks

    def adopt_prefix(self, row: int, n: int) -> None:
        super().adopt_prefix(row, n)
        self.journal += [ADOPT, row, n]

    def move_row(self, src: int, dst: int) -> int:
        n = super().move_row(src, dst)
        self.tables[src].row, self.tables[dst].row = src, dst  # the tables traded rows
        self.journal += [MOVE, src, dst]
        return n

    def drop_blocks(self, row: int, indices: list[int], null: int) -> None:
        super().drop_blocks(row, indices, null)
        if indices:
            self.journal += [DROP, row, null, len(indices), *indices]

    def truncate_row(self, row: int, n: int) -> None:
        before = self.lengths[row]
        super().truncate_row(row, n)
        if n < before:
            self.journal += [TRUNC, row, n]

    def take_journal(self) -> list[int]:
        out = list(self.journal)
        self.journal.clear()  # the tables hold this very list: clear it, do not rebind it
        return out


def replay(cache: BatchedPagedKVCache, journal: list[int]) -> int:
    """Apply rank 0's journal to a worker's cache; returns the records applied. An unknown
    record is refused: the two sides would no longer agree on where anything is."""
    i, n = 0, 0
    while i < len(journal):
        op = journal[i]
        if op == EXTEND:
            row, k = journal[i + 1], journal[i + 2]
            cache.tables[row].extend(journal[i + 3:i + 3 + k])
            i += 3 + k
        elif op == RESET:
            cache.reset_row(journal[i + 1])
            i += 2
        elif op == ADOPT:
            cache.adopt_prefix(journal[i + 1], journal[i + 2])
            i += 3
        elif op == MOVE:
            cache.move_row(journal[i + 1], journal[i + 2])
            i += 3
        elif op == TRUNC:
            cache.truncate_row(journal[i + 1], journal[i + 2])
            i += 3
        elif op == DROP:
            row, null, k = journal[i + 1], journal[i + 2], journal[i + 3]
            cache.drop_blocks(row, journal[i + 4:i + 4 + k], null)
            i += 4 + k
        else:
            raise RuntimeError(f"journal record {op} at {i} is not one of {OPS}")
        n += 1
    return n
