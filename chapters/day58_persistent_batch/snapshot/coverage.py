"""Day 58 snapshot (frozen).

How many decode steps a recorded window could replay, counted without a model or a device.

Day 33's frozen scheduler is the base: its release, growth and admission are untouched, and
``Scheduler`` here only inserts ``_compact`` between growth and admission and reports the moves
on ``SchedulerOutput.moves``. With ``compact_rows=False`` it is Day 33's scheduler exactly (the
free-row heap: lowest free row, nobody ever moves).

Counting rules:

- a *decode step* is an iteration whose schedule has at least one decode row;
- every batch size from 1 to the slot count has a bucket, so a step *replays* exactly when its
  decode rows are a prefix (``is_compact``) and is *scattered* otherwise;
- a move's *cells* are its source row's cached length when it moves (prompt and output, less
  the newest token, which the next forward writes);
- request ``i`` wants ``gen_lens[i % len(gen_lens)]`` tokens after a ``prompt_len`` prompt, and
  the pool holds every request's worst case, so nothing is preempted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day33_preemption.snapshot.request import Request
from chapters.day33_preemption.snapshot.scheduler import Scheduler as Day33Scheduler
from chapters.day33_preemption.snapshot.scheduler import SchedulerOutput as Day33Output

from .compact import COMPACTION_MODES, RowCompactor, RowMove, ScheduleRecord, is_compact

TOKEN = 1
BLOCK_SIZE = 16
COVERAGE_SHAPES = (
    (4, 8, (16,)), (4, 8, (8, 16)), (4, 8, (4, 32)),
    (8, 16, (16,)), (8, 16, (8, 16)), (8, 16, (4, 32)), (8, 16, (4, 8, 16, 32)),
    (16, 32, (4, 32)),
)
MODE_LABEL = {"free": "free rows", "persistent": "persistent"}


@dataclass(slots=True)
class SchedulerOutput(Day33Output):
    moves: list[RowMove] = field(default_factory=list)  # rows relabelled this call


class Scheduler(Day33Scheduler):
    """Release, grow, **compact**, admit."""

    def __init__(self, *args, compact_rows: bool = False, on_move=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.compact_rows = compact_rows
        self.compactor = RowCompactor("persistent" if compact_rows else "free", on_move)

    def schedule(self) -> SchedulerOutput:
        self.schedule_calls += 1
        out = SchedulerOutput(finished=self._release_finished())
        out.preempted = self._grow_running()
        out.moves = self._compact()
        out.decode = list(self.running)
        out.admitted = self._admit()
        return out

    def _compact(self) -> list[RowMove]:
        if not self.running:
            return []
        by_row = {r.slot: r for r in self.running}

        def relabel(move: RowMove) -> None:
            if move.dst not in self._free_slots:
                raise ValueError(f"move {move}: row {move.dst} is not free")
            r = by_row.pop(move.src)
            self._free_slots.remove(move.dst)
            heapq.heapify(self._free_slots)
            heapq.heappush(self._free_slots, move.src)
            r.slot = move.dst
            by_row[move.dst] = r

        return self.compactor.compact([r.slot for r in self.running], relabel,
                                      self.max_num_seqs)


def run_coverage(slots: int, requests: int, gen_lens: list[int], prompt_len: int = 4,
                 mode: str = "free", records: list[ScheduleRecord] | None = None,
                 compactor: RowCompactor | None = None, scheduler: type | None = None) -> dict:
    """One workload through one scheduler: decode steps, replayed, scattered, share, moves,
    cells, and the compactor's three counters. ``compactor`` and ``scheduler`` (a subclass of
    ``Scheduler``) replace the parts a counterfactual wants to change."""
    if mode not in COMPACTION_MODES:
        raise ValueError(f"mode={mode!r}; choose one of {COMPACTION_MODES}")
    worst = prompt_len + max(gen_lens)
    pool = BlockAllocator(slots * -(-worst // BLOCK_SIZE), BLOCK_SIZE)
    sched = (scheduler or Scheduler)(pool, slots, allocation="incremental",
                                     compact_rows=mode == "persistent")
    if compactor is not None:
        sched.compactor = compactor
    cells = 0

    def on_move(src: int, dst: int) -> None:
        nonlocal cells
        tenant = next(r for r in sched.running if r.slot == src)
        cells += tenant.num_tokens - 1

    sched.compactor.on_move = on_move
    for i in range(requests):
        sched.add(Request(i, [TOKEN] * prompt_len, max_tokens=gen_lens[i % len(gen_lens)]))
    decode_steps = replayed = iterations = 0
    while True:
        out = sched.schedule()
        if records is not None:
            records.append(ScheduleRecord.of(out))
        if out.num_scheduled == 0:
            if sched.has_unfinished():
                raise RuntimeError("nothing schedulable while requests wait: a deadlock")
            break
        iterations += 1
        if out.decode:
            decode_steps += 1
            replayed += is_compact(r.slot for r in out.decode)
        for r in out.admitted + out.decode:
            r.append_token(TOKEN)
        sched.check_invariants()
    assert pool.num_free == pool.num_blocks, "a block leaked"
    assert sched.preemptions == 0, "the pool was sized so that nothing is preempted"
    c = sched.compactor
    return {"decode_steps": decode_steps, "replayed": replayed,
            "scattered": decode_steps - replayed,
            "share": round(replayed / decode_steps, 4) if decode_steps else 1.0,
            "moves": c.moves, "cells": cells, "calls": c.calls, "compactions": c.compactions,
            "schedules": sched.schedule_calls, "iterations": iterations}


def coverage_table(prompt_len: int = 4) -> list[dict]:
    """Every shape under the free-row heap, then under the persistent batch."""
    rows = []
    for mode in COMPACTION_MODES:
        for slots, requests, gen in COVERAGE_SHAPES:
            res = run_coverage(slots, requests, list(gen), prompt_len, mode)
            rows.append({"batch": MODE_LABEL[mode], "slots": slots, "requests": requests,
                         "gen lengths": "/".join(map(str, gen)),
                         "decode steps": res["decode_steps"], "replayed": res["replayed"],
                         "scattered": res["scattered"], "share": f"{res['share']:.0%}",
                         "moves": res["moves"], "cells": res["cells"]})
    return rows
