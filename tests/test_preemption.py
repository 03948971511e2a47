"""Incremental allocation and preemption by recompute (Day 33).

Two halves: the scheduler over plain integers (allocation, victim choice, queue order), then a
small Llama for the claim that matters: a cramped engine and a roomy one give identical tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve import LLM, SamplingParams
from nanoserve.bench.schedbench import run_scheduled
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request, RequestState
from nanoserve.engine.scheduler import Scheduler

W, R, F = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED


def req(i, prompt_len=5, max_tokens=24):
    return Request(i, [7] * prompt_len, max_tokens=max_tokens)


def inc(num_blocks, slots=4, block_size=4, **kw):
    return Scheduler(KVCacheManager(num_blocks, block_size), slots, allocation="incremental",
                     **kw)


def step(s, token=5):
    out = s.schedule()
    for r in out.admitted + out.decode:
        r.append_token(token)
    s.check_invariants()
    return out


# ------------------------------------------------------------------ the allocation rule

def test_blocks_needed_for_a_fresh_request_is_its_prompt():
    s = inc(64)
    r = req(0, prompt_len=9)
    s.add(r)
    assert s.blocks_needed_for(r) == 3
    step(s)
    assert len(r.blocks) == 3


def test_a_running_request_needs_one_block_only_at_a_boundary():
    s = inc(64)
    r = req(0, prompt_len=4)  # 4 tokens: one full block
    s.add(r)
    step(s)  # prefill: 1 block; now 5 tokens (the new one not yet in the cache)
    needs = []
    for _ in range(8):
        needs.append(s.blocks_needed_for(r))
        step(s)
    assert needs == [1, 0, 0, 0, 1, 0, 0, 0]


def test_reserve_policy_needs_the_worst_case_then_nothing():
    s = Scheduler(KVCacheManager(64, 4), 4, allocation="reserve")
    r = req(0, prompt_len=5, max_tokens=24)
    s.add(r)
    assert s.blocks_needed_for(r) == 8
    step(s)
    assert s.blocks_needed_for(r) == 0


def test_a_preempted_request_needs_prompt_plus_generated():
    s = inc(4, slots=2)
    a, b = req("a", prompt_len=4, max_tokens=12), req("b", prompt_len=4, max_tokens=12)
    s.add(a)
    s.add(b)
    while b.num_preemptions == 0:
        step(s)
    assert b.state is W and b.num_preemptions == 1 and len(b.output_token_ids) == 5
    kv = s.kv_cache_manager
    assert s.blocks_needed_for(b) == kv.blocks_for_length(4 + len(b.output_token_ids))


def test_reservation_waste_is_zero_under_incremental():
    s = inc(64)
    for i in range(4):
        s.add(req(i, prompt_len=8, max_tokens=200))
    for _ in range(10):
        step(s)
        assert s.reservation_waste() == 0.0
        assert s.fragmentation_waste() < 4 / 8  # at most block_size - 1 per sequence


# ------------------------------------------------------------------ victims and queue order

def test_the_youngest_is_the_victim_and_goes_to_the_head_of_the_queue():
    s = inc(6, slots=3)
    a, b, c, d = (req(n, 4, 12) for n in "abcd")
    for r in (a, b, c, d):
        s.add(r)
    step(s)  # a, b, c admitted with one block each; d waits for a slot
    out = s.schedule()  # all three cross a boundary: 3 needed, 3 free -> no preemption
    assert not out.preempted
    for r in out.decode:
        r.append_token(5)
    for _ in range(3):
        step(s)
    out = s.schedule()  # the next boundary: a and b grow, c (youngest) is evicted
    assert out.preempted == [c]
    assert list(s.waiting)[:2] == [c, d]
    assert c.state is W and c.blocks == [] and c.slot is None


def test_the_oldest_running_request_is_never_a_victim():
    s = inc(6, slots=4)
    reqs = [req(i, 4, 16) for i in range(4)]
    for r in reqs:
        s.add(r)
    oldest = reqs[0]
    while s.has_unfinished():
        out = step(s)
        assert oldest not in out.preempted
    assert oldest.num_preemptions == 0 and s.preemptions > 0


def test_self_victim_when_nobody_is_younger():
    s = inc(3, slots=2)
    a, b = req("a", prompt_len=4, max_tokens=8), req("b", prompt_len=4, max_tokens=8)
    s.add(a)
    s.add(b)
    step(s)  # a: 1 block, b: 1 block, 1 free
    out = s.schedule()  # a takes the last free block; b has nobody younger: its own victim
    assert out.preempted == [b] and b.num_preemptions == 1
    assert out.decode == [a]


def test_crossing_a_boundary_on_the_step_the_pool_runs_dry():
    s = inc(4, slots=2)
    a, b = req("a", prompt_len=4, max_tokens=12), req("b", prompt_len=4, max_tokens=12)
    s.add(a)
    s.add(b)
    step(s)  # 1 + 1 blocks held, 2 free, both at 5 tokens
    out = s.schedule()  # both cross at once: exactly the 2 free blocks
    assert not out.preempted and s.kv_cache_manager.num_free == 0
    for r in out.decode:
        r.append_token(5)
    for _ in range(3):
        step(s)
    out = s.schedule()  # both cross again with the pool dry: b is evicted for a
    assert out.preempted == [b] and len(a.blocks) == 3
    s.check_invariants()


def test_a_preempted_request_resumes_with_its_tokens():
    s = inc(4, slots=2)
    a, b = req("a", 4, 12), req("b", 4, 12)
    s.add(a)
    s.add(b)
    while b.num_preemptions == 0:
        step(s, token=9)
    kept = list(b.output_token_ids)
    assert kept  # tokens survive the preemption
    while b.state is not R:
        step(s, token=9)
    assert b.output_token_ids[:len(kept)] == kept
    assert s.recomputed_tokens == 4 + len(kept)


def test_running_to_waiting_is_legal_now():
    r = req(0)
    r.transition(R)
    r.transition(W)
    assert r.state is W


def test_drain_returns_every_block_under_pressure():
    s = inc(7, slots=4)
    reqs = [req(i, 3 + i % 3, 4 + 3 * (i % 5)) for i in range(9)]
    for r in reqs:
        s.add(r)
    while s.has_unfinished():
        step(s)
    assert all(r.state is F for r in reqs)
    assert s.kv_cache_manager.num_free == 7 and s.preemptions > 0


# ------------------------------------------------------------------ the log's table

@pytest.mark.parametrize("pool,iters,occ,pre,rec", [
    (48, 44, 0.5455, 3, 55), (96, 28, 0.8571, 1, 25), (128, 24, 1.0, 0, 0)])
def test_day33_table_incremental(pool, iters, occ, pre, rec):
    out = run_scheduled(4, 4, pool, 5, [24], 4, "incremental")
    assert (out["forward_passes"], out["occupancy"], out["preemptions"],
            out["recomputed_tokens"]) == (iters, occ, pre, rec)
    assert out["reservation_waste"] == 0.0 and out["useful_tokens"] == 96


def test_day29_shape_needs_sixteen_blocks_and_never_preempts():
    gen = [4, 4, 4, 4, 4, 4, 4, 32]
    incremental = run_scheduled(8, 4, 1024, 5, gen, 8, "incremental")
    reserve = run_scheduled(8, 4, 1024, 5, gen, 8, "reserve")
    assert (incremental["peak_blocks_held"], reserve["peak_blocks_held"]) == (16, 31)
    assert incremental["preemptions"] == 0
    tight = run_scheduled(8, 4, 64, 5, gen, 8, "incremental")
    assert tight["forward_passes"] == 32 and tight["preemptions"] == 0


# ------------------------------------------------------------------ the claim that matters

@pytest.mark.parametrize("which", ["shipped", "random"])
def test_cramped_engine_gives_the_roomy_engines_tokens(hf_checkpoint, which):
    path = None if which == "shipped" else hf_checkpoint("llama3_rope")
    kw = dict(dtype="float32", block_size=4, max_num_seqs=6,
              skip_tokenizer_init=which == "random")
    prompts = [[0, *range(3 + i, 8 + i + i % 4)] for i in range(10)]
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i, ignore_eos=True)
              for i in range(10)]
    roomy = LLM(path, **kw)
    cramped = LLM(path, num_kv_blocks=14, **kw)
    a = [o.token_ids for o in roomy.generate(prompts, params)]
    b = [o.token_ids for o in cramped.generate(prompts, params)]
    assert a == b
    assert roomy.stats.preemptions == 0
    assert cramped.stats.preemptions > 0 and cramped.stats.recomputed_tokens > 0
    pool = cramped.core.scheduler.kv_cache_manager
    assert pool.num_free == pool.num_blocks


def test_seeded_sampling_survives_preemption(hf_checkpoint):
    """A resumed request keeps its generator, so sampled text is unchanged as well."""
    path = hf_checkpoint("gqa")
    kw = dict(dtype="float32", block_size=4, max_num_seqs=4, skip_tokenizer_init=True)
    prompts = [[0, 5 + i, 9, 11] for i in range(6)]
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=20, ignore_eos=True)
              for i in range(6)]
    cramped = LLM(path, num_kv_blocks=10, **kw)
    a = [o.token_ids for o in LLM(path, **kw).generate(prompts, params)]
    assert a == [o.token_ids for o in cramped.generate(prompts, params)]
    assert cramped.stats.preemptions > 0


# ------------------------------------------------------------------ more of the scheduler half

def test_a_victim_goes_ahead_of_older_waiting_requests():
    s = inc(4, slots=2)
    a, b, c = req("a", 4, 12), req("b", 4, 12), req("c", 4, 4)
    for r in (a, b, c):
        s.add(r)
    while b.num_preemptions == 0:
        step(s)
    assert list(s.waiting)[0] is b  # the head: it had started, so it resumes first


def test_several_victims_in_one_call_keep_their_age_order_in_the_queue():
    s = inc(8, slots=4)
    reqs = [req(i, 4, 12) for i in range(4)]
    for r in reqs:
        s.add(r)
    preempted = []
    while len(preempted) < 2:
        preempted += step(s).preempted
    waiting = [r for r in s.waiting if r.num_preemptions]
    assert [r.arrival for r in waiting] == sorted(r.arrival for r in waiting)


def test_a_preempted_request_is_not_decoded_in_that_iteration():
    s = inc(4, slots=2)
    a, b = req("a", 4, 12), req("b", 4, 12)
    s.add(a)
    s.add(b)
    while True:
        out = s.schedule()
        if out.preempted:
            break
        for r in out.admitted + out.decode:
            r.append_token(5)
    assert b in out.preempted and b not in out.decode and b not in out.admitted


def test_on_release_sees_the_victims_blocks_before_they_go_back():
    seen = []
    s = inc(4, slots=2, on_release=lambda r: seen.append((r.request_id, len(r.blocks))))
    a, b = req("a", 4, 12), req("b", 4, 12)
    s.add(a)
    s.add(b)
    while b.num_preemptions == 0:
        step(s)
    assert seen == [("b", 2)]


def test_recomputed_tokens_accumulate_over_resumes():
    s = inc(4, slots=2)
    a, b = req("a", 4, 12), req("b", 4, 12)
    s.add(a)
    s.add(b)
    resumed = []
    while s.has_unfinished():
        out = step(s)
        resumed += [r.num_tokens - 1 for r in out.admitted if r.num_preemptions]
    assert s.recomputed_tokens == sum(resumed) and resumed


def test_aborting_a_preempted_request():
    s = inc(4, slots=2)
    a, b = req("a", 4, 12), req("b", 4, 12)
    s.add(a)
    s.add(b)
    while b.num_preemptions == 0:
        step(s)
    s.abort(b)
    assert b.finish_reason == "abort" and b.blocks == [] and b not in s.waiting
    while s.has_unfinished():
        step(s)
    assert s.kv_cache_manager.num_free == 4


def test_reserve_never_preempts_it_waits():
    s = Scheduler(KVCacheManager(8, 4), 4, allocation="reserve")
    reqs = [req(i, 4, 12) for i in range(4)]
    for r in reqs:
        s.add(r)
    while s.has_unfinished():
        step(s)
    assert s.preemptions == 0 and s.blocked_on_blocks > 0


def test_incremental_runs_more_rows_at_once_than_reserve():
    def peak(policy):
        s = Scheduler(KVCacheManager(24, 4), 4, allocation=policy)
        for i in range(4):
            s.add(req(i, 5, 24))
        most = 0
        while s.has_unfinished():
            most = max(most, step(s).num_scheduled)
        return most
    assert (peak("reserve"), peak("incremental")) == (3, 4)


def test_a_request_finishing_at_a_boundary_is_released_not_grown():
    s = inc(3, slots=2)
    a = req("a", 4, 5)  # its last token arrives as it would cross into a third block
    b = req("b", 4, 8)
    s.add(a)
    s.add(b)
    while a.state is not F:
        step(s)
    out = s.schedule()
    assert a in out.finished and not out.preempted


def test_a_resumed_request_keeps_its_seniority():
    s = inc(6, slots=3)
    reqs = [req(i, 4, 16) for i in range(3)]
    for r in reqs:
        s.add(r)
    while reqs[2].num_preemptions == 0:
        step(s)
    assert reqs[2].arrival == 2  # it comes back as the same age, not as a newcomer
    late = req("late", 2, 2)
    s.add(late)
    assert late.arrival == 3


@settings(max_examples=40, deadline=None)
@given(slots=st.integers(1, 5), num_blocks=st.integers(6, 24),
       wants=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 14)), min_size=1,
                      max_size=14))
def test_random_incremental_workloads(slots, num_blocks, wants):
    s = inc(num_blocks, slots=slots)
    reqs = []
    for i, (p, m) in enumerate(wants):
        r = req(i, p, m)
        if s.kv_cache_manager.blocks_for_length(r.worst_case_tokens) <= num_blocks:
            s.add(r)
            reqs.append(r)
    while s.has_unfinished():
        oldest = min((r for r in s.running if r.state is R), key=lambda r: r.arrival,
                     default=None)
        out = step(s)
        assert oldest is None or oldest not in out.preempted or len(s.running) == 0
        assert s.reservation_waste() == 0.0
        assert s.fragmentation_waste() < 1.0
    assert s.kv_cache_manager.num_free == num_blocks
    assert all(r.state is F and len(r.output_token_ids) == r.max_tokens for r in reqs)


# ------------------------------------------------------------------ more of the model half

def test_reserve_and_incremental_engines_agree(hf_checkpoint):
    path = hf_checkpoint("head_dim")
    kw = dict(dtype="float32", block_size=4, max_num_seqs=4, skip_tokenizer_init=True,
              num_kv_blocks=16)
    prompts = [[0, 3 + i, 7, 9 + i] for i in range(7)]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    a = LLM(path, allocation="reserve", **kw).generate(prompts, params)
    cramped = LLM(path, allocation="incremental", **kw)
    b = cramped.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert cramped.stats.preemptions > 0
    assert sum(o.num_preemptions for o in b) == cramped.stats.preemptions


def test_text_and_stop_strings_survive_preemption():
    """The shipped model, real text, a stop string: a cramped pool changes nothing."""
    prompts = ["The while statement", "Classes provide", "The import statement", "A list"]
    params = SamplingParams(temperature=0, max_tokens=40, stop=["\n\n"])
    roomy = LLM(dtype="float32", block_size=4).generate(prompts, params)
    cramped_llm = LLM(dtype="float32", block_size=4, num_kv_blocks=16)
    cramped = cramped_llm.generate(prompts, params)
    assert [(o.text, o.finish_reason) for o in roomy] == \
        [(o.text, o.finish_reason) for o in cramped]
    assert cramped_llm.stats.preemptions > 0


def test_static_batching_refuses_nothing_the_scheduler_accepts(hf_checkpoint):
    """Door checks agree: what one batching policy admits, the other runs too."""
    path = hf_checkpoint("gqa")
    kw = dict(dtype="float32", block_size=4, num_kv_blocks=6, skip_tokenizer_init=True)
    prompts, params = [[0, 1, 2]] * 3, SamplingParams(temperature=0, max_tokens=20)
    a = LLM(path, batching="static", **kw).generate(prompts, params)
    b = LLM(path, **kw).generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
