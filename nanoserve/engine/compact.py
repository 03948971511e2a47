"""Row compaction: keep the running requests in cache rows 0..n-1 (the persistent batch).

Why this module exists: a recorded decode graph reads the window ``slots[:n]``, the first ``n``
rows of the cache, so it can only replay a step whose decode rows are exactly ``{0, ..., n-1}``.
The free-row scheduler hands out the lowest free row and never moves anybody, so as soon as one
request finishes below a neighbour that is still running, the survivor sits above a hole and
every step from then on is scattered: correct, and never replayed.

The fix is to move rows, and a move is cheap because of paging. A block id names a place in the
pool; moving a request to another row hands over its ``BlockTable`` (a host object, by
reference), copies its row of the slot table (``length(src)`` int64 on the device) and changes
``Request.slot``. The K/V itself is never read or written.

Three questions about an occupancy (the set of rows the running requests hold):

- ``is_compact``: are they a prefix ``0..n-1``?
- ``holes``: empty rows inside the prefix;
- ``strays``: occupied rows at or past ``n``.

Strays and holes always come in equal numbers (``n`` tenants, ``n`` places below ``n``), so a
compaction only permutes existing tenants and never allocates anything. ``plan_compaction``
pairs the sorted strays with the sorted holes; ``moves_needed`` (one per hole) and
``move_cells`` (the cached length of every source) are its price. ``RowCompactor`` is what the
scheduler holds: a mode, the engine's ``on_move`` callback, and three counters that only
together say what happened (``calls``: schedules that looked; ``compactions``: looks that moved
something; ``moves``).

```pycon
>>> rows = [1, 3, 4]            # three running requests, row 0 and row 2 empty
>>> holes(rows), strays(rows)
([0, 2], [3, 4])
>>> [m.render() for m in plan_compaction(rows)]
['3->0', '4->2']
>>> is_compact([1, 0, 2]), is_compact([0, 2])
(True, False)

```

The gates that hold a run to these rules (every decode step replayed, every compaction exactly
its holes, never more moves than releases) are measurement, not scheduling, so they live beside
the benchmark that runs them, in ``nanoserve.bench.gates``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nanoserve.cuda.buckets import is_compact  # noqa: F401 - the occupancy's first question

COMPACTION_MODES = ("free", "persistent")


@dataclass(frozen=True, slots=True)
class RowMove:
    """One tenant changing rows: planned on the host, applied by the engine's ``on_move``,
    reported on ``SchedulerOutput.moves``, read back by ``nanoserve.bench.gates``. Frozen
    because it travels."""

    src: int
    dst: int

    def __post_init__(self):
        if self.src < 0 or self.dst < 0:
            raise ValueError(f"a row index is never negative: {self.src}->{self.dst}")
        if self.src == self.dst:
            raise ValueError(f"row {self.src} cannot move onto itself")

    def render(self) -> str:
        return f"{self.src}->{self.dst}"

    def __str__(self) -> str:
        return self.render()


def _occupancy(rows: Iterable[int]) -> list[int]:
    """The occupied rows, sorted; two tenants in one row is a bookkeeping bug, so it raises."""
    occ = sorted(rows)
    if len(set(occ)) != len(occ):
        raise ValueError(f"rows {occ} name one row twice: two requests cannot share a row")
    if occ and occ[0] < 0:
        raise ValueError(f"rows {occ} include a negative row")
    return occ


def holes(rows: Iterable[int]) -> list[int]:
    """Empty rows below n, where n is how many rows are occupied; ascending."""
    occ = _occupancy(rows)
    taken = set(occ)
    return [i for i in range(len(occ)) if i not in taken]


def strays(rows: Iterable[int]) -> list[int]:
    """Occupied rows at or above n; ascending. Always as many as there are holes."""
    occ = _occupancy(rows)
    return [r for r in occ if r >= len(occ)]


def plan_compaction(rows: Iterable[int]) -> list[RowMove]:
    """The moves that make ``rows`` a prefix: the i-th smallest stray into the i-th smallest
    hole. Each destination is empty when its move runs (a hole is never a source), each row
    moves at most once, and a compact occupancy plans nothing."""
    occ = _occupancy(rows)
    h, s = holes(occ), strays(occ)
    assert len(h) == len(s), f"{len(h)} holes but {len(s)} strays in {occ}"
    return [RowMove(src, dst) for src, dst in zip(s, h, strict=True)]


def moves_needed(rows: Iterable[int]) -> int:
    """The fewest single-row moves that make ``rows`` a prefix: one per hole."""
    return len(holes(rows))


def move_cells(moves: Iterable[RowMove], lengths: Mapping[int, int] | Sequence[int]) -> int:
    """Slot-table cells the moves copy: each move carries its source row's cached length.

    ``lengths`` is read as the rows stood before the first move (a plan never moves a row
    twice, so that is also what each source holds when its move runs)."""
    return sum(lengths[m.src] for m in moves)


class RowCompactor:
    """The scheduler's compaction step: a mode, a callback, and three counters.

    ``mode="free"`` never moves anybody (the Week-8 heap: lowest free row, tenants stay put);
    ``"persistent"`` plans with ``plan_compaction``. Each move is handed to ``on_move(src, dst)``
    first, which is the engine relabelling its cache row and may refuse, and then to the
    caller's ``relabel`` (the scheduler moving ``Request.slot``), so a refused move leaves the
    host bookkeeping as it was."""

    def __init__(self, mode: str = "persistent",
                 on_move: Callable[[int, int], object] | None = None):
        if mode not in COMPACTION_MODES:
            raise ValueError(f"mode={mode!r}; choose one of {COMPACTION_MODES}")
        self.mode = mode
        self.on_move = on_move
        self.calls = 0  # occupancies looked at
        self.compactions = 0  # looks that moved at least one row
        self.moves = 0  # rows moved, in all

    def plan(self, rows: Sequence[int]) -> list[RowMove]:
        return plan_compaction(rows) if self.mode == "persistent" else []

    def compact(self, rows: Sequence[int], relabel: Callable[[RowMove], None] | None = None,
                num_rows: int | None = None) -> list[RowMove]:
        """Plan for the occupied ``rows`` and apply the plan; returns the moves made.

        Each move is checked against the occupancy as it stands by then, before either half
        applies it: a source that holds nobody, a destination that holds somebody, or one past
        ``num_rows`` (the batch's row count, when given) means the plan was made for other
        rows, and it is refused rather than carried out."""
        self.calls += 1
        plan = self.plan(rows)
        occupied = set(rows)
        for i, move in enumerate(plan):
            beyond = num_rows is not None and move.dst >= num_rows
            if move.src not in occupied or move.dst in occupied or beyond:
                raise ValueError(f"move {move} does not fit the occupied rows "
                                 f"{sorted(occupied)}: the plan was made for other rows")
            if self.on_move is not None:
                self.on_move(move.src, move.dst)
            if relabel is not None:
                relabel(move)
            occupied.remove(move.src)
            occupied.add(move.dst)
            if i == 0:
                self.compactions += 1
            self.moves += 1
        return plan

    def __repr__(self) -> str:
        return (f"RowCompactor({self.mode!r}, calls={self.calls}, "
                f"compactions={self.compactions}, moves={self.moves})")
