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

The gates at the bottom are the claims stated as functions that can fail: every decode step of
an arm replayed, every compaction moved exactly as many rows as there were holes, and a run never
moved more rows than it released.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

COMPACTION_MODES = ("free", "persistent")


@dataclass(frozen=True, slots=True)
class RowMove:
    """One tenant changing rows: planned on the host, applied by the engine's ``on_move``,
    reported on ``SchedulerOutput.moves``, read back by the gates. Frozen because it travels."""

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


def is_compact(rows: Iterable[int]) -> bool:
    """True when the rows are exactly 0..n-1, in any order (an empty batch is compact).

    This is the one definition of "a recorded window can replay this step": the scheduler keeps
    it true and the capture asks it every step (``rows_are_a_prefix`` delegates here)."""
    occ = sorted(rows)
    return occ == list(range(len(occ)))


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


# ---------------------------------------------------------------------- the gates


class GateFailed(AssertionError):
    """A Day-58 claim did not hold on this run; the message says where and by how much."""


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """What one ``schedule()`` did to the rows, captured when it returned (a request's slot
    may change again later, so the rows are copied, not referenced)."""

    decode_rows: tuple[int, ...]  # the rows of this iteration's decode batch, after moves
    moves: tuple[RowMove, ...]  # the moves this schedule made, in order
    releases: int  # rows given back this call: finished, aborted and preempted

    @classmethod
    def of(cls, out) -> ScheduleRecord:
        """From a ``SchedulerOutput``, read before the engine steps it."""
        return cls(tuple(r.slot for r in out.decode), tuple(out.moves),
                   len(out.finished) + len(out.preempted))


def rows_before(decode_rows: Iterable[int], moves: Sequence[RowMove]) -> list[int]:
    """Undo ``moves`` (last first) to get the occupancy the compaction started from; refuses
    moves that do not fit the rows (a source still occupied, a destination not occupied)."""
    rows = set(decode_rows)
    for m in reversed(moves):
        if m.dst not in rows or m.src in rows:
            raise GateFailed(f"move {m} does not fit the decode rows {sorted(decode_rows)}")
        rows.remove(m.dst)
        rows.add(m.src)
    return sorted(rows)


def check_arm_replayed_every_step(decode_steps: int, replayed: int, arm: str = "arm") -> str:
    """Day 57's acceptance gate: every decode step of this arm replayed a recorded window.

    Counts rather than rows, so it reads the same from the host harness and from an engine's
    graph counters."""
    if not 0 <= replayed <= decode_steps:
        raise GateFailed(f"{arm}: replayed={replayed} is not within 0..{decode_steps} "
                         f"decode steps; the counters disagree with each other")
    if replayed != decode_steps:
        raise GateFailed(f"{arm}: {decode_steps - replayed} of {decode_steps} decode steps fell "
                         f"through to the eager forward (replayed {replayed})")
    return f"{arm}: replayed {replayed} of {decode_steps} decode steps"


def check_moves_minimal(records: Iterable[ScheduleRecord]) -> str:
    """Every compaction moved exactly one row per hole and left a prefix.

    Short of that, the batch still cannot replay, which the replay counters would show. Over
    it, rows that were already in place got copied, and the result is a prefix all the same, so
    only counting the moves catches it."""
    schedules = moved = 0
    for i, rec in enumerate(records, 1):
        schedules += 1
        before = rows_before(rec.decode_rows, rec.moves)
        need = moves_needed(before)
        if len(rec.moves) < need or not is_compact(rec.decode_rows):
            raise GateFailed(f"schedule {i}: rows {before} had {need} hole(s) and "
                             f"{len(rec.moves)} move(s) left rows {sorted(rec.decode_rows)}, "
                             f"not a prefix: too few moves")
        if len(rec.moves) > need:
            raise GateFailed(f"schedule {i}: rows {before} had {need} hole(s) but "
                             f"{len(rec.moves)} moves were made "
                             f"({', '.join(map(str, rec.moves))}): rows already in place "
                             f"were copied")
        moved += len(rec.moves)
    return f"{moved} moves over {schedules} schedules, each exactly the holes it found"


def check_moves_amortised(records: Iterable[ScheduleRecord]) -> str:
    """Only a release opens a hole, and each hole costs one move to close; so at every point
    of a run the moves so far are at most the releases so far. Checked schedule by schedule."""
    moves = releases = 0
    for i, rec in enumerate(records, 1):
        moves += len(rec.moves)
        releases += rec.releases
        if moves > releases:
            raise GateFailed(f"schedule {i}: {moves} moves so far against {releases} releases; "
                             f"a compaction is paying per step, not per completion")
    return f"{moves} moves against {releases} releases"
