"""The persistent batch (Day 58): row compaction, the move that is only a relabel, the gates.

Four layers, cheapest first: the pure functions of ``nanoserve.engine.compact`` against a brute
force; ``move_row`` on the slot table and the paged cache; the scheduler with ``compact_rows``
over plain integers (preemption and aborts included); then the shipped model, where compaction
must not change a single token, and the coverage harness, which must reproduce the log's table.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from log_tables import LOG_COVERAGE

from nanoserve import LLM, SamplingParams
from nanoserve.attention.paged import BatchedPagedKVCache, SlotTable
from nanoserve.bench import graphbench
from nanoserve.bench.gates import (
    GateFailed,
    ScheduleRecord,
    check_arm_replayed_every_step,
    check_moves_amortised,
    check_moves_minimal,
    rows_before,
)
from nanoserve.engine.compact import (
    COMPACTION_MODES,
    RowCompactor,
    RowMove,
    holes,
    is_compact,
    move_cells,
    moves_needed,
    plan_compaction,
    strays,
)
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler

# an occupancy: distinct rows of a batch of at most 9 slots
occupancies = st.sets(st.integers(0, 8), max_size=9).map(sorted)


def apply_moves(rows, moves):
    """Apply moves to an occupancy the way the cache does: refuse a destination in use."""
    occ = set(rows)
    for m in moves:
        assert m.src in occ and m.dst not in occ, f"{m} on {sorted(occ)}"
        occ.remove(m.src)
        occ.add(m.dst)
    return sorted(occ)


def fewest_moves(rows, universe):
    """Brute force: breadth-first over occupancies, one single-row move per edge."""
    start = frozenset(rows)
    seen, frontier = {start}, deque([(start, 0)])
    while frontier:
        occ, d = frontier.popleft()
        if is_compact(occ):
            return d
        for src in occ:
            for dst in range(universe):
                if dst not in occ:
                    nxt = (occ - {src}) | {dst}
                    if nxt not in seen:
                        seen.add(nxt)
                        frontier.append((nxt, d + 1))
    raise AssertionError("unreachable: every occupancy can be compacted")


# ------------------------------------------------------------------ RowMove and the three questions

def test_row_move_is_frozen_and_renders():
    m = RowMove(3, 0)
    assert m.render() == "3->0" and str(m) == "3->0"
    with pytest.raises(AttributeError):
        m.src = 1  # type: ignore[misc]
    assert m == RowMove(3, 0) and len({m, RowMove(3, 0)}) == 1


@pytest.mark.parametrize("src,dst", [(2, 2), (-1, 0), (0, -3)])
def test_row_move_refuses_nonsense(src, dst):
    with pytest.raises(ValueError):
        RowMove(src, dst)


@pytest.mark.parametrize("rows,compact", [
    ([], True), ([0], True), ([1, 0, 2], True), ([0, 1, 2, 3], True),
    ([1], False), ([0, 2], False), ([0, 0], False), ([1, 2, 3], False),
])
def test_is_compact(rows, compact):
    assert is_compact(rows) is compact


def test_is_compact_takes_any_iterable():
    assert is_compact(r for r in (2, 0, 1)) and not is_compact(iter([0, 3]))


@pytest.mark.parametrize("rows,h,s", [
    ([1, 3, 4], [0, 2], [3, 4]),
    ([0, 1, 2], [], []),
    ([7], [0], [7]),
    ([], [], []),
    ([2, 5, 0, 1], [3], [5]),
])
def test_holes_and_strays_examples(rows, h, s):
    assert holes(rows) == h and strays(rows) == s


@pytest.mark.parametrize("fn", [holes, strays, plan_compaction, moves_needed])
def test_two_requests_in_one_row_is_refused(fn):
    with pytest.raises(ValueError, match="twice"):
        fn([0, 2, 2])


def test_a_negative_row_is_refused():
    with pytest.raises(ValueError, match="negative"):
        holes([-1, 0])


@given(occupancies)
def test_there_are_always_as_many_strays_as_holes(rows):
    assert len(holes(rows)) == len(strays(rows))


@given(occupancies)
def test_plan_pairs_sorted_strays_with_sorted_holes(rows):
    plan = plan_compaction(rows)
    assert [m.src for m in plan] == strays(rows)
    assert [m.dst for m in plan] == holes(rows)


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, 6), max_size=7).map(sorted))
def test_plan_compaction_against_brute_force(rows):
    """The plan is as short as the shortest sequence of moves a search can find."""
    plan = plan_compaction(rows)
    assert len(plan) == fewest_moves(rows, 7)
    assert is_compact(apply_moves(rows, plan))


@given(occupancies)
def test_moves_needed_is_the_number_of_holes(rows):
    assert moves_needed(rows) == len(holes(rows)) == len(plan_compaction(rows))


@given(occupancies)
def test_a_plan_never_touches_a_row_in_place_nor_moves_one_twice(rows):
    plan = plan_compaction(rows)
    n = len(rows)
    assert all(m.src >= n and m.dst < n for m in plan)
    assert len({m.src for m in plan}) == len(plan) == len({m.dst for m in plan})


@given(occupancies)
def test_a_compact_occupancy_plans_nothing_and_planning_is_idempotent(rows):
    after = apply_moves(rows, plan_compaction(rows))
    assert plan_compaction(after) == []
    assert plan_compaction(list(range(len(rows)))) == []


@given(occupancies, st.randoms(use_true_random=False))
def test_move_cells_is_the_strays_lengths(rows, rnd):
    lengths = {r: rnd.randint(1, 2000) for r in rows}
    plan = plan_compaction(rows)
    assert move_cells(plan, lengths) == sum(lengths[s] for s in strays(rows))
    # every stray must leave, so no plan carries fewer cells than this one
    assert move_cells(plan, lengths) <= sum(lengths.values())


def test_move_cells_reads_a_sequence_too():
    assert move_cells([RowMove(3, 0), RowMove(4, 2)], [9, 9, 9, 11, 22]) == 33


# ------------------------------------------------------------------ RowCompactor

def test_compactor_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        RowCompactor("sorted")
    assert COMPACTION_MODES == ("free", "persistent")


def test_free_mode_looks_and_never_moves():
    c = RowCompactor("free", on_move=lambda s, d: pytest.fail("free rows never move"))
    assert c.compact([1, 3]) == [] and c.compact([0]) == []
    assert (c.calls, c.compactions, c.moves) == (2, 0, 0)


def test_persistent_mode_counts_calls_compactions_and_moves():
    seen = []
    c = RowCompactor("persistent", on_move=lambda s, d: seen.append((s, d)))
    assert c.compact([0, 1]) == []
    assert c.compact([1, 3, 4]) == [RowMove(3, 0), RowMove(4, 2)]
    assert c.compact([0, 5]) == [RowMove(5, 1)]
    assert seen == [(3, 0), (4, 2), (5, 1)]
    assert (c.calls, c.compactions, c.moves) == (3, 2, 3)
    assert "calls=3" in repr(c)


def test_on_move_runs_before_relabel_and_a_refusal_stops_the_plan():
    order = []

    def on_move(src, dst):
        order.append(("engine", src, dst))
        if dst == 2:
            raise ValueError("row 2 is not empty")

    c = RowCompactor("persistent", on_move=on_move)
    with pytest.raises(ValueError, match="not empty"):
        c.compact([1, 3, 4], relabel=lambda m: order.append(("host", m.src, m.dst)))
    assert order == [("engine", 3, 0), ("host", 3, 0), ("engine", 4, 2)]
    assert c.moves == 1  # only the move that went through is counted


# ------------------------------------------------------------------ move_row on the device half

def small_cache(rows=4, blocks=16, block_size=4, max_len=16):
    return BatchedPagedKVCache(num_layers=2, num_kv_heads=2, head_dim=4, num_blocks=blocks,
                               block_size=block_size, max_num_seqs=rows, max_model_len=max_len)


def fill_row(cache, row, blocks, n):
    """Give ``row`` its blocks and run one step that writes ``n`` tokens of K/V there."""
    cache.tables[row].extend(blocks)
    cache.begin_step([row], [n])
    for layer in range(cache.k.shape[0]):
        q = torch.randn(1, 4, n, 4)
        kv = torch.randn(1, 2, n, 4)
        cache.attend(layer, q, kv, kv + 1, torch.arange(n)[None])
    cache.end_step()


def test_slot_table_move_row_copies_the_length_and_empties_the_source():
    t = SlotTable(3, 8)
    t.write(2, 0, [40, 41, 42, 43, 60])
    t.move_row(2, 0, 5)
    assert t.cells[0, :5].tolist() == [40, 41, 42, 43, 60]
    assert (t.cells[0, 5:] == -1).all() and (t.cells[2] == -1).all()


def test_slot_table_refuses_a_destination_in_use():
    t = SlotTable(3, 8)
    t.write(0, 0, [4, 5])
    t.write(1, 0, [8])
    with pytest.raises(ValueError, match="not empty"):
        t.move_row(1, 0, 1)
    with pytest.raises(ValueError, match="itself"):
        t.move_row(1, 1, 1)
    assert t.cells[0, :2].tolist() == [4, 5] and t.cells[1, 0].item() == 8


def test_cache_move_row_is_a_relabel():
    cache = small_cache()
    fill_row(cache, 3, [5, 9], 6)
    k, v = cache.k.clone(), cache.v.clone()
    k_ptr = cache.k.data_ptr()
    src_table, dst_table = cache.tables[3], cache.tables[1]
    addressing = cache.slots.cells[3, :6].clone()
    forgotten = []
    cache.backend.forget_row = forgotten.append
    assert cache.move_row(3, 1) == 6
    assert cache.tables[1] is src_table and cache.tables[3] is dst_table  # swapped
    assert cache.tables[1].blocks == [5, 9] and cache.tables[3].blocks == []
    assert cache.lengths[1] == 6 and cache.lengths[3] == 0
    assert torch.equal(cache.slots.cells[1, :6], addressing)
    assert (cache.slots.cells[3] == -1).all()
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v)  # K/V neither read nor written
    assert cache.k.data_ptr() == k_ptr
    assert set(forgotten) == {1, 3}  # the Day-50 mapping forgets both rows


def test_every_row_keeps_a_block_table_through_moves():
    cache = small_cache()
    fill_row(cache, 2, [1], 3)
    fill_row(cache, 3, [2], 2)
    cache.move_row(2, 0)
    cache.move_row(3, 1)
    assert len(cache.tables) == 4 and len({id(t) for t in cache.tables}) == 4
    assert cache.reset_row(0) == [1] and cache.reset_row(1) == [2]
    assert cache.reset_row(2) == [] and cache.reset_row(3) == []


@pytest.mark.parametrize("occupy", ["length", "blocks"])
def test_cache_move_row_refuses_a_destination_in_use_and_changes_nothing(occupy):
    cache = small_cache()
    fill_row(cache, 3, [5], 2)
    if occupy == "length":
        fill_row(cache, 0, [7], 1)
    else:
        cache.tables[0].extend([7])  # blocks granted, not yet written
    forgotten = []
    cache.backend.forget_row = forgotten.append
    before = ([t.blocks[:] for t in cache.tables], cache.lengths[:], cache.slots.cells.clone())
    with pytest.raises(ValueError, match="not empty"):
        cache.move_row(3, 0)
    after = ([t.blocks[:] for t in cache.tables], cache.lengths[:], cache.slots.cells.clone())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    assert forgotten == []


@pytest.mark.parametrize("src,dst", [(1, 1), (4, 0), (0, -1)])
def test_cache_move_row_refuses_bad_rows(src, dst):
    with pytest.raises(ValueError):
        small_cache().move_row(src, dst)


def test_cache_move_row_refuses_during_a_step():
    cache = small_cache()
    cache.tables[2].extend([3])
    cache.begin_step([2], [1])
    with pytest.raises(RuntimeError, match="during a step"):
        cache.move_row(2, 0)
    cache.end_step()


def decode_once(cache, row, q, kv):
    pos = cache.lengths[row]
    cache.begin_step([row], [1])
    out = cache.attend(0, q, kv, kv, torch.tensor([[pos]]))
    cache.end_step()
    return out


@pytest.mark.parametrize("attention", ["reference", "gathered"])
def test_the_moved_row_attends_as_it_would_have(attention):
    """Same K/V, same addressing, new row index: the next steps' outputs are unchanged. On the
    gathered path the row was already indexed under its old number before it moved."""
    a, b = (BatchedPagedKVCache(2, 2, 4, 16, 4, 4, 16, attention=attention) for _ in range(2))
    for c in (a, b):
        torch.manual_seed(1)
        fill_row(c, 3, [4, 11, 2], 5)
        torch.manual_seed(2)
        decode_once(c, 3, torch.randn(1, 4, 1, 4), torch.randn(1, 2, 1, 4))
    a.move_row(3, 0)
    for _ in range(3):
        q, kv = torch.randn(1, 4, 1, 4), torch.randn(1, 2, 1, 4)
        torch.testing.assert_close(decode_once(a, 0, q, kv), decode_once(b, 3, q, kv),
                                   rtol=1e-6, atol=1e-6)
    assert a.lengths[0] == b.lengths[3] == 9


def test_a_newcomer_in_the_row_left_behind_reads_only_its_own_context():
    """After 3->0, a new request takes row 3; one gathered step over both rows matches each
    tenant run alone: nothing of the old tenant is still indexed under row 3."""
    def mk():
        return BatchedPagedKVCache(2, 2, 4, 16, 4, 4, 16, attention="gathered")

    a, alone0, alone3 = mk(), mk(), mk()
    for c in (a, alone0):
        torch.manual_seed(1)
        fill_row(c, 3, [4, 11, 2], 5)
        torch.manual_seed(2)
        decode_once(c, 3, torch.randn(1, 4, 1, 4), torch.randn(1, 2, 1, 4))
    a.move_row(3, 0)
    for c in (a, alone3):
        torch.manual_seed(3)
        fill_row(c, 3, [7, 8], 2)
    q, kv = torch.randn(2, 4, 1, 4), torch.randn(2, 2, 1, 4)
    a.begin_step([0, 3], [1, 1])
    both = a.attend(0, q, kv, kv, torch.tensor([[6], [2]]))
    a.end_step()
    torch.testing.assert_close(both[:1], decode_once(alone0, 3, q[:1], kv[:1]))
    torch.testing.assert_close(both[1:], decode_once(alone3, 3, q[1:], kv[1:]))


# ------------------------------------------------------------------ the scheduler with compact_rows

def make(slots=4, blocks=64, block_size=4, compact=True, compactor=None, **kw):
    s = Scheduler(KVCacheManager(blocks, block_size), slots, allocation="incremental",
                  compact_rows=compact, **kw)
    if compactor is not None:
        s.compactor = compactor
    return s


def drive(s, reqs, abort_at=None, rnd=None):
    """Run to completion; returns the records and, per schedule, who was admitted, decoded,
    finished and preempted (ids only). ``abort_at`` aborts a random running request on those
    iterations."""
    for r in reqs:
        s.add(r)
    records, who, it = [], [], 0
    while True:
        it += 1
        if abort_at and it in abort_at and s.running:
            live = [r for r in s.running if not r.is_finished]
            if live:
                s.abort(rnd.choice(live))
        out = s.schedule()
        records.append(ScheduleRecord.of(out))
        who.append(tuple(tuple(sorted(r.request_id for r in group)) for group in
                         (out.admitted, out.decode, out.finished, out.preempted)))
        if s.compact_rows:  # after compaction and admission the running rows are a prefix
            assert is_compact(r.slot for r in s.running)
            assert all(r.slot >= len(out.decode) for r in out.admitted)
        if out.num_scheduled == 0:
            assert not s.has_unfinished()
            break
        for r in out.admitted + out.decode:
            r.append_token(5)
        s.check_invariants()
    assert s.kv_cache_manager.num_free == s.kv_cache_manager.num_blocks
    return records, who


def workload(wants, prompt_len=3):
    return [Request(i, [7] * prompt_len, max_tokens=w) for i, w in enumerate(wants)]


def test_compaction_is_off_by_default_and_nothing_ever_moves():
    s = Scheduler(KVCacheManager(64, 4), 4, allocation="incremental")
    assert s.compact_rows is False and s.compactor.mode == "free"
    reqs = workload([2, 9, 3, 12, 4, 7])
    for r in reqs:
        s.add(r)
    admitted_at = {}
    while s.has_unfinished():
        out = s.schedule()
        assert out.moves == []
        admitted_at.update({r.request_id: r.slot for r in out.admitted})
        assert all(r.slot == admitted_at[r.request_id] for r in out.decode)
        for r in out.admitted + out.decode:
            r.append_token(5)
    assert s.compactor.moves == 0


def test_a_survivor_changes_slot_and_the_output_reports_the_move():
    s = make(slots=2)
    a, b = workload([2, 5])
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert (a.slot, b.slot) == (0, 1)
    for _ in range(2):
        for r in out.admitted + out.decode:
            r.append_token(5)
        out = s.schedule()
    assert out.finished == [a] and out.moves == [RowMove(1, 0)]
    assert b.slot == 0 and out.decode == [b]
    s.check_invariants()
    assert s._free_slots == [1]


def test_compaction_runs_between_growth_and_admission():
    """The survivor fills the hole and the newcomer takes the row above the prefix; a
    request admitted by a schedule is never moved by it."""
    s = make(slots=3)
    r0, r1, r2, r3 = reqs = workload([2, 6, 6, 6])
    for r in reqs:
        s.add(r)
    for _ in range(2):
        out = s.schedule()
        for r in out.admitted + out.decode:
            r.append_token(5)
    assert r0.is_finished and (r0.slot, r1.slot, r2.slot) == (0, 1, 2)
    out = s.schedule()
    assert out.finished == [r0] and out.moves == [RowMove(2, 0)]
    assert out.admitted == [r3] and (r2.slot, r3.slot) == (0, 2)


def test_free_and_persistent_differ_only_in_where_the_rows_are():
    wants = [3, 17, 4, 9, 12, 2, 30, 5, 8, 6]
    rec_free, who_free = drive(make(compact=False), workload(wants))
    rec_pers, who_pers = drive(make(compact=True), workload(wants))
    assert who_free == who_pers
    assert sum(len(r.moves) for r in rec_free) == 0 < sum(len(r.moves) for r in rec_pers)


def test_compaction_sweeps_a_hole_a_preemption_opened():
    """Pool of 6 blocks, three slots: the youngest request sits in row 0 when the pool runs
    dry, is preempted there, and the schedule that preempts it also fills its row."""
    s = make(slots=3, blocks=6, block_size=4)
    records, who = drive(s, workload([2, 2, 6, 12, 12]))
    i = next(i for i, rec in enumerate(records) if who[i][3] and rec.moves)
    assert who[i][3] == (4,) and records[i].moves == (RowMove(1, 0),)
    assert s.preemptions > 0
    assert check_moves_minimal(records) and check_moves_amortised(records)


def test_a_refused_move_propagates_out_of_schedule_and_changes_no_slot():
    def refuse(src, dst):
        raise ValueError(f"row {dst} is not empty")

    s = make(slots=2, on_move=refuse)
    a, b = workload([1, 5])
    s.add(a)
    s.add(b)
    out = s.schedule()
    for r in out.admitted:
        r.append_token(5)  # a is done after its prefill
    with pytest.raises(ValueError, match="not empty"):
        s.schedule()
    assert b.slot == 1 and 0 in s._free_slots and 1 not in s._free_slots


class Clobber(RowCompactor):
    """A broken planner: moves the top row onto the bottom one, which is in use."""

    def plan(self, rows):
        return [RowMove(max(rows), min(rows))] if len(rows) > 1 else []


class Overshoot(RowCompactor):
    """A broken planner: moves the top row past the last slot."""

    def plan(self, rows):
        return [RowMove(max(rows), 99)] if rows else []


@pytest.mark.parametrize("compactor", [Clobber, Overshoot])
def test_a_broken_plan_is_refused_before_anything_moves(compactor):
    seen = []
    s = make(slots=3, compactor=compactor("persistent", on_move=lambda a, b: seen.append(a)))
    reqs = workload([5, 5])
    for r in reqs:
        s.add(r)
    out = s.schedule()
    for r in out.admitted:
        r.append_token(5)
    with pytest.raises(ValueError, match="does not fit"):
        s.schedule()
    assert [r.slot for r in reqs] == [0, 1] and sorted(s._free_slots) == [2]
    assert seen == []  # refused before the engine's half ran


def test_a_loop_that_finishes_nobody_moves_nothing():
    res = graphbench.run_coverage(8, 16, [16], mode="persistent")
    assert res["moves"] == 0 and res["_counters"]["compactions"] == 0
    assert res["_counters"]["calls"] == res["decode_steps"] == 30


def test_three_counters_on_the_worst_row_of_the_table():
    """47 calls and 8 moves, as the log's lesson 7 says. Its prose also says 8 compactions;
    under its own table's plan two schedules fill two holes each (5: 6->0, 7->4; 17: 6->0,
    7->2), so the same run makes 6 compactions, and that is what the counter says."""
    records = []
    res = graphbench.run_coverage(8, 16, [4, 8, 16, 32], mode="persistent", records=records)
    assert res["_counters"] == {"calls": 47, "compactions": 6, "moves": 8}
    assert [i + 1 for i, r in enumerate(records) if len(r.moves) == 2] == [5, 17]


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(1, 5), blocks=st.integers(8, 24),
       wants=st.lists(st.integers(1, 14), min_size=1, max_size=12),
       aborts=st.sets(st.integers(2, 30), max_size=3), seed=st.integers(0, 99))
def test_random_workloads_with_preemption_and_aborts(slots, blocks, wants, aborts, seed):
    """Prefix after every schedule (checked in drive), moves <= releases at every point, each
    compaction exactly the holes it found, and the same decisions as the free-row heap."""
    rec_p, who_p = drive(make(slots, blocks, compact=True), workload(wants), aborts,
                         random.Random(seed))
    rec_f, who_f = drive(make(slots, blocks, compact=False), workload(wants), aborts,
                         random.Random(seed))
    assert who_p == who_f
    check_moves_minimal(rec_p)
    check_moves_amortised(rec_p)
    assert sum(len(r.moves) for r in rec_p) <= sum(r.releases for r in rec_p)


# ------------------------------------------------------------ the gates, and runs that break them

class UnderMover(RowCompactor):
    """Fills only the first hole: the batch stays scattered."""

    def plan(self, rows):
        return super().plan(rows)[:1]


class OverMover(RowCompactor):
    """Makes the right moves, then walks the top row out to a spare row and back: a prefix
    every time, two copies that should never have happened."""

    def __init__(self, slots, *a, **kw):
        super().__init__(*a, **kw)
        self.slots = slots

    def plan(self, rows):
        plan = super().plan(rows)
        n = len(rows)
        if 0 < n < self.slots:
            plan += [RowMove(n - 1, n), RowMove(n, n - 1)]
        return plan


GATE_RUN = (8, 16, [4, 8, 16, 32])


def test_the_gates_pass_on_the_persistent_batch():
    records = []
    res = graphbench.run_coverage(*GATE_RUN, mode="persistent", records=records)
    assert "47 of 47" in check_arm_replayed_every_step(res["decode_steps"], res["replayed"])
    assert check_moves_minimal(records).startswith("8 moves")
    assert check_moves_amortised(records) == "8 moves against 16 releases"


def test_replayed_every_step_fails_on_free_rows():
    res = graphbench.run_coverage(*GATE_RUN, mode="free")
    with pytest.raises(GateFailed, match="35 of 47 decode steps fell through"):
        check_arm_replayed_every_step(res["decode_steps"], res["replayed"], "free rows")


def test_replayed_every_step_fails_on_counters_that_disagree():
    with pytest.raises(GateFailed, match="disagree"):
        check_arm_replayed_every_step(10, 11)


def test_replayed_every_step_fails_when_too_few_moves_are_made():
    res = graphbench.run_coverage(*GATE_RUN, compactor=UnderMover("persistent"))
    assert res["scattered"] > 0
    with pytest.raises(GateFailed):
        check_arm_replayed_every_step(res["decode_steps"], res["replayed"])


@pytest.mark.parametrize("mode", ["free", "under"])
def test_moves_minimal_fails_on_too_few(mode):
    records = []
    compactor = UnderMover("persistent") if mode == "under" else None
    graphbench.run_coverage(*GATE_RUN, mode="free", records=records, compactor=compactor)
    with pytest.raises(GateFailed, match="too few moves"):
        check_moves_minimal(records)


def test_moves_minimal_fails_on_too_many_even_though_every_step_replays():
    """The invisible failure: the outcome is a prefix every step, the bill is not."""
    records = []
    res = graphbench.run_coverage(*GATE_RUN, records=records,
                                  compactor=OverMover(8, "persistent"))
    assert res["share"] == 1.0  # a test of the outcome would pass
    with pytest.raises(GateFailed, match="rows already in place were copied"):
        check_moves_minimal(records)


def test_moves_amortised_fails_when_compaction_pays_per_step():
    records = []
    graphbench.run_coverage(*GATE_RUN, records=records, compactor=OverMover(8, "persistent"))
    with pytest.raises(GateFailed, match="per step, not per completion"):
        check_moves_amortised(records)


def test_gates_refuse_a_record_whose_moves_do_not_fit():
    bad = ScheduleRecord(decode_rows=(0, 1), moves=(RowMove(3, 2),), releases=1)
    with pytest.raises(GateFailed, match="does not fit"):
        check_moves_minimal([bad])
    assert rows_before((0, 1), (RowMove(3, 0),)) == [1, 3]


def test_gate_verdicts_in_the_harness_text():
    res = graphbench.run_coverage(*GATE_RUN, mode="free", records=(records := []))
    verdicts = graphbench.gate_verdicts(res, records, "free rows")
    assert [v.split()[0] for v in verdicts] == ["FAIL", "FAIL", "PASS"]


# ------------------------------------------------------------------ the coverage table

LOG_TABLE = "\n".join(LOG_COVERAGE.splitlines()[1:]) + "\n"  # the 16 rows, no header


def log_rows():
    rows = []
    for line in LOG_TABLE.splitlines():
        parts = line.split()
        if parts[0] == "free":
            parts = ["free rows", *parts[2:]]
        rows.append(parts)
    return rows


@pytest.fixture(scope="module")
def table():
    return graphbench.coverage_table()


def test_coverage_table_has_the_logs_sixteen_rows(table):
    assert len(table) == 16
    got = [[str(r[c]) for c in graphbench.COLUMNS] for r in table]
    assert got == log_rows()


@pytest.mark.parametrize("i", range(16))
def test_coverage_row(table, i):
    row = table[i]
    assert row["replayed"] + row["scattered"] == row["decode steps"]
    assert [str(row[c]) for c in graphbench.COLUMNS] == log_rows()[i]


def test_the_worst_row_is_bought_back_for_640_bytes(table):
    free = next(r for r in table if r["batch"] == "free rows" and r["gen lengths"] == "4/8/16/32")
    pers = next(r for r in table
                if r["batch"] == "persistent" and r["gen lengths"] == "4/8/16/32")
    assert (free["share"], free["scattered"]) == ("26%", 35)
    assert (pers["share"], pers["moves"], pers["cells"]) == ("100%", 8, 80)
    assert pers["cells"] * torch.tensor([], dtype=torch.long).element_size() == 640


def test_coverage_cli_prints_the_table_and_writes_csv(tmp_path, capsys):
    from nanoserve.cli import main

    path = tmp_path / "out" / "day-58-graphbench.csv"
    assert main(["bench", "graph", "--coverage", "--csv", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    body = [line.split() for line in printed if line.split()[:1] in (["free"], ["persistent"])]
    assert body == [line.split() for line in LOG_TABLE.splitlines()]
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(graphbench.COLUMNS) and len(lines) == 17
    assert lines[7] == "free rows,8,16,4/8/16/32,47,12,35,26%,0,0"


def test_coverage_csv_defaults_under_build():
    assert graphbench.DEFAULT_CSV.parts[0] == "build"


@pytest.mark.parametrize("mode,expected", [
    ("persistent", {"decode_steps": 47, "replayed": 47, "scattered": 0, "share": 1.0,
                    "moves": 8, "cells": 80}),
    ("free", {"decode_steps": 47, "replayed": 12, "scattered": 35, "share": 0.2553,
              "moves": 0, "cells": 0}),
])
def test_single_run_json(capsys, mode, expected):
    from nanoserve.cli import main

    assert main(["bench", "graph", "--slots", "8", "--requests", "16", "--gen-lens",
                 "4,8,16,32", "--mode", mode, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == expected and list(got) == list(expected)


def test_single_run_json_defaults_and_cycled_lengths(capsys):
    from nanoserve.cli import main

    assert main(["bench", "graph", "--slots", "4", "--requests", "8", "--gen-lens", "4,32",
                 "--mode", "persistent", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["decode_steps"], got["moves"], got["cells"]) == (43, 5, 95)  # prompt_len 4
    assert 0.0 <= got["share"] <= 1.0


@pytest.mark.parametrize("argv", [["--gen-lens", "4,0"], ["--slots", "0"], ["--weights", "w"]])
def test_graph_bench_refuses(capsys, argv):
    from nanoserve.cli import main

    assert main(["bench", "graph", *argv, "--json"]) == 2
    out = capsys.readouterr().out
    assert "error" in out


def test_the_arms_over_sockets_refuse_a_folder_without_weights():
    # run_arms is built now (tests/test_graphs.py runs an arm); a missing folder is refused
    with pytest.raises(ValueError, match="config.json"):
        graphbench.run_arms("weights", "cuda", [1, 2, 4, 8])


# ------------------------------------------------------------------ the shipped model

TINY = dict(dtype="float32", skip_tokenizer_init=True)


@pytest.mark.parametrize("graphs,compact,expected", [
    (False, None, False), (True, None, True), (True, False, False), (False, True, True),
])
def test_compact_rows_follows_cuda_graphs_unless_told(graphs, compact, expected):
    llm = LLM(cuda_graphs=graphs, compact_rows=compact, max_model_len=64, **TINY)
    assert llm.cuda_graphs is graphs and llm.compact_rows is expected
    sched = llm.core.scheduler
    assert sched.compact_rows is expected
    assert sched.compactor.mode == ("persistent" if expected else "free")
    assert sched.compactor.on_move == llm.engine.move_row


CRAMPED_PROMPTS = [[0, *range(3 + i, 7 + i + i % 3)] for i in range(8)]
CRAMPED_PARAMS = [SamplingParams(temperature=0, max_tokens=5 + 2 * i, ignore_eos=True)
                  for i in range(8)]
CRAMPED_KW = dict(block_size=4, max_num_seqs=4, max_model_len=64, **TINY)


@pytest.fixture(scope="module")
def roomy_free_tokens():
    llm = LLM(compact_rows=False, **CRAMPED_KW)
    return [o.token_ids for o in llm.generate(CRAMPED_PROMPTS, CRAMPED_PARAMS)]


@pytest.mark.parametrize("num_kv_blocks", [None, 9])
def test_compaction_changes_no_token_roomy_or_cramped(roomy_free_tokens, num_kv_blocks):
    llm = LLM(compact_rows=True, num_kv_blocks=num_kv_blocks, **CRAMPED_KW)
    out = llm.generate(CRAMPED_PROMPTS, CRAMPED_PARAMS)
    assert [o.token_ids for o in out] == roomy_free_tokens
    assert llm.core.scheduler.compactor.moves > 0
    if num_kv_blocks is not None:
        assert llm.stats.preemptions > 0
    assert all(len(t) == 0 for t in llm.engine.cache.tables)


def test_eight_moves_carry_80_int64_measured_from_real_moves():
    """The log's worst row on the real engine: every move_row the scheduler asked for."""
    llm = LLM(compact_rows=True, max_num_seqs=8, max_model_len=64, **TINY)
    cache, moved = llm.engine.cache, []
    real = cache.move_row

    def spy(src, dst):
        moved.append(real(src, dst))
        return moved[-1]

    cache.move_row = spy
    prompts = [[0, 5 + i, 9, 11] for i in range(16)]
    params = [SamplingParams(temperature=0, max_tokens=(4, 8, 16, 32)[i % 4], ignore_eos=True)
              for i in range(16)]
    llm.generate(prompts, params)
    assert len(moved) == 8 and sum(moved) == 80
    assert sum(moved) * cache.slots.cells.element_size() == 640
    assert llm.core.scheduler.compactor.calls == 47


def test_engine_move_row_refuses_a_row_in_use():
    llm = LLM(max_num_seqs=3, max_model_len=64, block_size=4, **TINY)
    e = llm.engine
    for row in (0, 2):
        e.grant(row, 4)
    e.prefill([0, 2], [[0, 5, 9], [0, 6]])
    with pytest.raises(ValueError, match="not empty"):
        e.move_row(2, 0)
    assert e.move_row(2, 1) == 2
    assert e.cache.lengths == [3, 2, 0]
    e.release(0)
    e.release(1)


def test_itertools_sanity_for_the_brute_force():
    """The brute force itself: on every occupancy of 5 slots it agrees with the hole count."""
    for k in range(6):
        for rows in itertools.combinations(range(5), k):
            assert fewest_moves(rows, 5) == len(holes(rows))
