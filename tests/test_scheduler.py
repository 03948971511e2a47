"""The request state machine and the scheduler, pure: a real allocator, integer tokens, no model.
Every decision here is bookkeeping, and bookkeeping is what is quietly wrong when it is wrong."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.bench.schedbench import run_scheduled, run_static
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import _LEGAL_TRANSITIONS, IllegalTransition, Request, RequestState
from nanoserve.engine.scheduler import Scheduler

W, R, F = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED
EOS = 2


def req(i, prompt_len=5, max_tokens=4, **kw):
    return Request(i, [7] * prompt_len, max_tokens=max_tokens, eos_token_ids=frozenset({EOS}),
                   **kw)


def sched(num_blocks=64, block_size=4, slots=4, **kw):
    return Scheduler(KVCacheManager(num_blocks, block_size), slots, **kw)


def step(s: Scheduler, token=5):
    """One iteration of the host-only loop: schedule, then one token per scheduled request."""
    out = s.schedule()
    for r in out.admitted + out.decode:
        r.append_token(token)
    s.check_invariants()
    return out


def in_state(state):
    r = req("x")
    if state is not W:
        r.transition(R)
    if state is F:
        r.transition(F)
    return r


# ------------------------------------------------------------------ the transition table

LEGAL = {(W, R), (W, F), (R, F), (R, W)}  # (R, W): preemption, legal since Day 33


@pytest.mark.parametrize("src,dst", list(itertools.product([W, R, F], repeat=2)),
                         ids=lambda s: s.value)
def test_every_edge_of_the_table(src, dst):
    r = in_state(src)
    if (src, dst) in LEGAL:
        r.transition(dst)
        assert r.state is dst
    else:
        with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
            r.transition(dst)
        assert r.state is src  # a refused edge changes nothing


def test_the_table_is_data():
    assert set(_LEGAL_TRANSITIONS) == {W, R, F}
    assert {(a, b) for a, bs in _LEGAL_TRANSITIONS.items() for b in bs} == LEGAL
    assert not _LEGAL_TRANSITIONS[F]  # finished is final


def test_only_a_running_request_takes_tokens():
    with pytest.raises(IllegalTransition, match="waiting"):
        req(0).append_token(5)
    with pytest.raises(IllegalTransition, match="finished"):
        in_state(F).append_token(5)


# ------------------------------------------------------------------ stop rules

def _running(**kw):
    r = req(0, **kw)
    r.transition(R)
    return r


def test_budget_gives_length():
    r = _running(max_tokens=2)
    assert (r.append_token(5), r.append_token(5)) == (False, True)
    assert (r.state, r.finish_reason) == (F, "length")


def test_eos_as_the_last_budgeted_token_is_stop():
    r = _running(max_tokens=2)
    r.append_token(5)
    assert r.append_token(EOS)
    assert (r.finish_reason, r.stop_reason) == ("stop", EOS)


def test_stop_token_ids_stop():
    r = _running(max_tokens=9, stop_token_ids=frozenset({11}))
    assert not r.append_token(5) and r.append_token(11)
    assert (r.finish_reason, r.stop_reason, r.output_token_ids) == ("stop", 11, [5, 11])


def test_empty_prompt_and_zero_budget_are_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        Request(0, [], max_tokens=1)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        Request(0, [1], max_tokens=0)


# ------------------------------------------------------------------ admission

def test_release_before_admit_refills_a_slot_in_the_same_iteration():
    s = sched(slots=2)
    a, b, c = req("a", max_tokens=1), req("b", max_tokens=3), req("c")
    for r in (a, b, c):
        s.add(r)
    out1 = step(s)
    assert out1.admitted == [a, b] and a.is_finished and c.state is W
    out2 = step(s)  # a is released and c takes its slot in the same call
    assert out2.finished == [a] and out2.admitted == [c] and out2.decode == [b]
    assert c.slot == 0


def test_lowest_free_slot_is_reused():
    s = sched(slots=3)
    reqs = [req(i, max_tokens=m) for i, m in enumerate([3, 1, 3, 3])]
    for r in reqs:
        s.add(r)
    step(s)
    assert [r.slot for r in reqs[:3]] == [0, 1, 2]
    step(s)
    assert reqs[3].slot == 1


def test_fifo_order():
    s = sched(slots=2)
    reqs = [req(i, max_tokens=1) for i in range(5)]
    for r in reqs:
        s.add(r)
    order = []
    while s.has_unfinished():
        order += [r.request_id for r in step(s).admitted]
    assert order == [0, 1, 2, 3, 4]


def test_no_skip_ahead_past_a_blocked_head():
    s = sched(num_blocks=10, block_size=4, slots=4)
    s.add(req("long", prompt_len=4, max_tokens=24))  # 7 blocks
    s.add(req("big", prompt_len=4, max_tokens=12))  # 4 blocks: does not fit beside it
    s.add(req("small", prompt_len=1, max_tokens=1))  # 1 block: would fit, must wait
    out = step(s)
    assert [r.request_id for r in out.admitted] == ["long"]
    assert [r.request_id for r in s.waiting] == ["big", "small"]
    assert s.blocked_on_blocks == 1


def test_a_blocked_head_is_admitted_once_blocks_return():
    s = sched(num_blocks=8, block_size=4, slots=4)
    first, second = req(0, prompt_len=4, max_tokens=20), req(1, prompt_len=4, max_tokens=20)
    s.add(first)
    s.add(second)
    while first.state is not F:
        step(s)
    assert second.state is W
    assert step(s).admitted == [second]


def test_blocks_are_reserved_for_the_worst_case_at_admission():
    s = sched(num_blocks=64, block_size=4)
    r = req(0, prompt_len=5, max_tokens=24)
    s.add(r)
    step(s)
    assert len(r.blocks) == 8  # ceil(29 / 4)
    assert s.kv_cache_manager.num_free == 56


def test_full_batch_and_dry_pool_are_told_apart():
    full = sched(num_blocks=64, slots=1)
    full.add(req(0))
    full.add(req(1))
    step(full)
    assert (full.blocked_on_slots, full.blocked_on_blocks) == (1, 0)
    assert full.kv_cache_manager.num_free > 0  # the pool was fine

    dry = sched(num_blocks=3, block_size=4, slots=4)
    dry.add(req(0, prompt_len=4, max_tokens=8))
    dry.add(req(1, prompt_len=4, max_tokens=8))
    step(dry)
    assert (dry.blocked_on_slots, dry.blocked_on_blocks) == (0, 1)
    assert len(dry._free_slots) == 3  # slots were free


def test_door_check_refuses_what_could_never_run():
    s = sched(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="need 5 KV blocks; the pool has 4"):
        s.add(req("huge", prompt_len=10, max_tokens=10))
    assert not s.waiting
    exact = req("fits", prompt_len=8, max_tokens=8)  # exactly the whole pool
    s.add(exact)
    while s.has_unfinished():
        step(s)
    assert exact.finish_reason == "length"


def test_only_waiting_requests_can_be_added():
    with pytest.raises(ValueError, match="not waiting"):
        sched().add(in_state(R))


def test_unknown_policy_and_bad_slots_are_refused():
    with pytest.raises(ValueError, match="allocation='lazy'"):
        sched(allocation="lazy")
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(KVCacheManager(4, 4), 0)


# ------------------------------------------------------------------ output and release

def test_output_splits_admitted_from_decode_and_reports_finished_once():
    s = sched(slots=4)
    a, b = req("a", max_tokens=2), req("b", max_tokens=5)
    s.add(a)
    out = step(s)
    assert (out.admitted, out.decode) == ([a], [])
    s.add(b)
    out = step(s)
    assert (out.admitted, out.decode) == ([b], [a])
    seen = []
    while s.has_unfinished():
        seen += step(s).finished
    assert seen == [a, b]


def test_on_release_runs_before_the_blocks_go_back():
    events = []
    s = sched(on_release=lambda r: events.append((r.request_id, list(r.blocks))))
    r = req(0, max_tokens=1)
    s.add(r)
    step(s)
    s.schedule()
    assert events == [(0, [0, 1])] and r.blocks == []  # ceil((5 + 1) / 4) blocks


# ------------------------------------------------------------------ abort

def test_abort_waiting():
    s = sched(slots=1)
    a, b = req("a"), req("b")
    s.add(a)
    s.add(b)
    step(s)
    s.abort(b)
    assert (b.state, b.finish_reason, b.blocks, b.slot) == (F, "abort", [], None)
    assert not s.waiting and s.schedule().finished == [b]


def test_abort_running_returns_resources_now():
    released = []
    s = sched(num_blocks=8, slots=2, on_release=lambda r: released.append(r.slot))
    a = req("a", max_tokens=20)
    s.add(a)
    step(s)
    s.abort(a)
    assert released == [0] and s.kv_cache_manager.num_free == 8 and a.finish_reason == "abort"
    s.check_invariants()
    assert s.schedule().finished == [a]
    assert not s.has_unfinished()


def test_abort_finished_is_refused():
    s = sched()
    r = req(0, max_tokens=1)
    s.add(r)
    step(s)
    s.schedule()
    with pytest.raises(ValueError, match="already finished"):
        s.abort(r)


# ------------------------------------------------------------------ what it costs

def test_reservation_waste_the_logs_case():
    """Four requests, 8-token prompt, 200-token budget, block_size 16: 52 reserved, 4 held."""
    s = sched(num_blocks=64, block_size=16, slots=4)
    reqs = [req(i, prompt_len=8, max_tokens=200) for i in range(4)]
    for r in reqs:
        s.add(r)
    step(s)
    assert sum(len(r.blocks) for r in reqs) == 52
    assert round(s.reservation_waste(), 2) == 0.92


def test_stopping_at_the_first_token_held_twelve_of_thirteen_for_nothing():
    s = sched(num_blocks=64, block_size=16, slots=4)
    r = req(0, prompt_len=8, max_tokens=200)
    s.add(r)
    s.schedule()
    r.append_token(EOS)
    assert len(r.blocks) == 13 and s.kv_cache_manager.blocks_for_length(r.num_tokens) == 1


def test_day30_counts_host_only():
    scheduled = run_scheduled(8, 4, 1024, 5, [4, 4, 4, 4, 4, 4, 4, 32], 8)
    static = run_static(8, 5, [4, 4, 4, 4, 4, 4, 4, 32], 8)
    assert (scheduled["issued_tokens"], scheduled["useful_tokens"]) == (60, 60)
    assert static["issued_tokens"] == 256
    assert scheduled["finish_iteration"][0] == 4 and static["returned_iteration"][0] == 32
    many = run_scheduled(8, 4, 1024, 5, [4, 4, 4, 4, 4, 4, 4, 32], 24)
    assert (many["forward_passes"], many["schedule_calls"]) == (44, 45)
    assert run_static(8, 5, [4, 4, 4, 4, 4, 4, 4, 32], 24)["forward_passes"] == 96


@pytest.mark.parametrize("pool,passes,occupancy", [(48, 96, 0.25), (96, 48, 0.5),
                                                   (128, 24, 1.0)])
def test_week8_rows_of_the_day33_table(pool, passes, occupancy):
    out = run_scheduled(4, 4, pool, 5, [24], 4, "reserve")
    assert (out["forward_passes"], out["occupancy"]) == (passes, occupancy)


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(1, 6), num_blocks=st.integers(8, 40),
       wants=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1,
                      max_size=20),
       abort_at=st.lists(st.integers(0, 30), max_size=4))
def test_random_workloads_drain_with_nothing_leaked(slots, num_blocks, wants, abort_at):
    s = sched(num_blocks=num_blocks, block_size=4, slots=slots)
    reqs = []
    for i, (p, m) in enumerate(wants):
        r = req(i, prompt_len=p, max_tokens=m)
        if s.kv_cache_manager.blocks_for_length(r.worst_case_tokens) <= num_blocks:
            s.add(r)
            reqs.append(r)
    for it in range(500):
        if not s.has_unfinished():
            break
        if it in abort_at:
            live = [r for r in reqs if not r.is_finished]
            if live:
                s.abort(live[it % len(live)])
        step(s)
    s.schedule()
    assert not s.has_unfinished()
    assert s.kv_cache_manager.num_free == num_blocks
    assert all(r.is_finished for r in reqs)
