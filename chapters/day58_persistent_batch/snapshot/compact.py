"""Day 58 snapshot (frozen).

Row compaction: the running requests live in cache rows 0..n-1, so a recorded decode window that
reads ``slots[:n]`` can replay every step.

An occupancy is the set of rows the running requests hold. With ``n`` tenants there are ``n``
places below ``n``, so every empty place below ``n`` (a *hole*) is matched by a tenant at or above
``n`` (a *stray*). Filling the holes with the strays permutes tenants; nothing is allocated.
Pairing them sorted against sorted is the plan, one move per hole is its length, and each move
copies its source row's cached length of slot-table cells, never the K/V those cells point at.

>>> holes([1, 3, 4]), strays([1, 3, 4])
([0, 2], [3, 4])
>>> [m.render() for m in plan_compaction([1, 3, 4])]
['3->0', '4->2']

The gates at the end say the day's claims as functions that raise: a run replayed every decode
step; each compaction moved one row per hole, no fewer and no more; moves never outran releases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

COMPACTION_MODES = ("free", "persistent")


@dataclass(frozen=True, slots=True)
class RowMove:
    """A tenant going from row ``src`` to the empty row ``dst``."""

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
    occ = sorted(rows)
    if len(set(occ)) != len(occ):
        raise ValueError(f"rows {occ} name one row twice: two requests cannot share a row")
    if occ and occ[0] < 0:
        raise ValueError(f"rows {occ} include a negative row")
    return occ


def is_compact(rows: Iterable[int]) -> bool:
    """Rows exactly 0..n-1, in any order: the only steps a recorded window can replay."""
    occ = sorted(rows)
    return occ == list(range(len(occ)))


def holes(rows: Iterable[int]) -> list[int]:
    """Empty rows below the tenant count, ascending."""
    occ = _occupancy(rows)
    taken = set(occ)
    return [i for i in range(len(occ)) if i not in taken]


def strays(rows: Iterable[int]) -> list[int]:
    """Occupied rows at or above the tenant count, ascending (as many as the holes)."""
    occ = _occupancy(rows)
    return [r for r in occ if r >= len(occ)]


def plan_compaction(rows: Iterable[int]) -> list[RowMove]:
    """The i-th smallest stray into the i-th smallest hole."""
    occ = _occupancy(rows)
    h, s = holes(occ), strays(occ)
    assert len(h) == len(s), f"{len(h)} holes but {len(s)} strays in {occ}"
    return [RowMove(src, dst) for src, dst in zip(s, h, strict=True)]


def moves_needed(rows: Iterable[int]) -> int:
    return len(holes(rows))


def move_cells(moves: Iterable[RowMove], lengths: Mapping[int, int] | Sequence[int]) -> int:
    """Slot-table cells copied: each move carries its source row's cached length."""
    return sum(lengths[m.src] for m in moves)


class RowCompactor:
    """A mode (``free`` moves nobody, ``persistent`` plans), the engine's ``on_move``, and the
    counters ``calls`` (occupancies looked at), ``compactions`` (looks that moved a row) and
    ``moves`` (rows moved)."""

    def __init__(self, mode: str = "persistent",
                 on_move: Callable[[int, int], object] | None = None):
        if mode not in COMPACTION_MODES:
            raise ValueError(f"mode={mode!r}; choose one of {COMPACTION_MODES}")
        self.mode = mode
        self.on_move = on_move
        self.calls = 0
        self.compactions = 0
        self.moves = 0

    def plan(self, rows: Sequence[int]) -> list[RowMove]:
        return plan_compaction(rows) if self.mode == "persistent" else []

    def compact(self, rows: Sequence[int], relabel: Callable[[RowMove], None] | None = None,
                num_rows: int | None = None) -> list[RowMove]:
        """Plan, then apply each move: the engine's ``on_move`` first (it may refuse), the
        host's ``relabel`` second. A move that does not fit the rows as they stand is refused."""
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
    """A Day-58 claim did not hold on this run."""


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One ``schedule()``: its decode rows after the moves, the moves, and the releases."""

    decode_rows: tuple[int, ...]
    moves: tuple[RowMove, ...]
    releases: int  # finished, aborted and preempted this call

    @classmethod
    def of(cls, out) -> ScheduleRecord:
        return cls(tuple(r.slot for r in out.decode), tuple(out.moves),
                   len(out.finished) + len(out.preempted))


def rows_before(decode_rows: Iterable[int], moves: Sequence[RowMove]) -> list[int]:
    """The occupancy before ``moves``, found by undoing them last first."""
    rows = set(decode_rows)
    for m in reversed(moves):
        if m.dst not in rows or m.src in rows:
            raise GateFailed(f"move {m} does not fit the decode rows {sorted(decode_rows)}")
        rows.remove(m.dst)
        rows.add(m.src)
    return sorted(rows)


def check_arm_replayed_every_step(decode_steps: int, replayed: int, arm: str = "arm") -> str:
    if not 0 <= replayed <= decode_steps:
        raise GateFailed(f"{arm}: replayed={replayed} is not within 0..{decode_steps} "
                         f"decode steps; the counters disagree with each other")
    if replayed != decode_steps:
        raise GateFailed(f"{arm}: {decode_steps - replayed} of {decode_steps} decode steps fell "
                         f"through to the eager forward (replayed {replayed})")
    return f"{arm}: replayed {replayed} of {decode_steps} decode steps"


def check_moves_minimal(records: Iterable[ScheduleRecord]) -> str:
    """Each schedule moved exactly one row per hole it found and left a prefix."""
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
    """Moves so far never exceed releases so far, at every schedule."""
    moves = releases = 0
    for i, rec in enumerate(records, 1):
        moves += len(rec.moves)
        releases += rec.releases
        if moves > releases:
            raise GateFailed(f"schedule {i}: {moves} moves so far against {releases} releases; "
                             f"a compaction is paying per step, not per completion")
    return f"{moves} moves against {releases} releases"
