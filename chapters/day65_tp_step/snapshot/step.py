"""Day 65 snapshot (frozen): the one message a forward costs, and the journal it carries.

Rank 0 runs the scheduler; the workers run only forwards. Before each forward rank 0 sends one
flat list of int64s:

    [kind, B, nhold, njournal, rows(B), lens(B), hold(nhold), journal(njournal), tokens]

and the journal is every change rank 0 made to the cache's addressing since the last forward,
as integer records (EXTEND row n blocks..., RESET row, ADOPT row n, MOVE src dst). A worker that
applies the records to its own tables holds rank 0's tables, block for block.

>>> ints = encode(DECODE, [0, 2], [[7], [9]], [], [EXTEND, 2, 1, 5])
>>> ints
[2, 2, 0, 4, 0, 2, 1, 1, EXTEND, 2, 1, 5, 7, 9]
>>> tables = {0: [], 2: []}
>>> apply(tables, {}, decode(ints)[4])
1
>>> tables
{0: [], 2: [5]}
"""

from __future__ import annotations

PREFILL, DECODE, STOP = 1, 2, 3
EXTEND, RESET, ADOPT, MOVE = 1, 2, 3, 4
HEADER = 1024  # int64 cells in the first broadcast; the first holds the message's length


def encode(kind: int, rows: list[int], token_lists: list[list[int]], hold: list[int],
           journal: list[int]) -> list[int]:
    lens = [len(t) for t in token_lists]
    return [kind, len(rows), len(hold), len(journal), *rows, *lens, *sorted(hold), *journal,
            *(t for toks in token_lists for t in toks)]


def decode(ints: list[int]):
    kind, b, nh, nj = ints[:4]
    rows, lens = ints[4:4 + b], ints[4 + b:4 + 2 * b]
    i = 4 + 2 * b
    hold, journal = ints[i:i + nh], ints[i + nh:i + nh + nj]
    i += nh + nj
    tokens = []
    for n in lens:
        tokens.append(ints[i:i + n])
        i += n
    return kind, rows, tokens, hold, journal


def broadcasts(ints: list[int]) -> int:
    """One for the header; a second for the tail when the message outgrows it."""
    return 1 + (len(ints) > HEADER - 1)


def apply(tables: dict[int, list[int]], lengths: dict[int, int], journal: list[int]) -> int:
    """Replay ``journal`` on plain tables (row -> block ids) and lengths; returns records."""
    i = n = 0
    while i < len(journal):
        op = journal[i]
        if op == EXTEND:
            row, k = journal[i + 1], journal[i + 2]
            tables.setdefault(row, []).extend(journal[i + 3:i + 3 + k])
            i += 3 + k
        elif op == RESET:
            tables[journal[i + 1]] = []
            lengths[journal[i + 1]] = 0
            i += 2
        elif op == ADOPT:
            lengths[journal[i + 1]] = journal[i + 2]
            i += 3
        elif op == MOVE:
            src, dst = journal[i + 1], journal[i + 2]
            tables[src], tables[dst] = tables.get(dst, []), tables.get(src, [])
            lengths[src], lengths[dst] = 0, lengths.get(src, 0)
            i += 3
        else:
            raise ValueError(f"record {op} at {i} is not one of EXTEND, RESET, ADOPT, MOVE")
        n += 1
    return n
