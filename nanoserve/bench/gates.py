"""The Day-58 gates: the persistent batch's claims as functions that raise when they fail.

Why this module exists: a benchmark table can say "100% replayed" and still hide a compactor that
copies rows that were already in place, or one that pays a move every step. These gates read what
a run did and fail loudly, naming the schedule and the numbers: every decode step of an arm
replayed a recorded window, every compaction moved exactly one row per hole and left a prefix,
and at every point of a run the moves so far are at most the releases so far. They are
measurement, not scheduling, so they live here beside ``graphbench``, which runs them; the rules
they check (``is_compact``, ``moves_needed``) are ``nanoserve.engine.compact``'s, imported downward.

```pycon
>>> from nanoserve.engine.compact import RowMove
>>> rec = ScheduleRecord(decode_rows=(0, 1), moves=(RowMove(3, 1),), releases=1)
>>> rows_before(rec.decode_rows, rec.moves)       # row 1's tenant came down from row 3
[0, 3]
>>> check_moves_minimal([rec]), check_moves_amortised([rec])
('1 moves over 1 schedules, each exactly the holes it found', '1 moves against 1 releases')

```
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nanoserve.engine.compact import RowMove, is_compact, moves_needed


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
