"""Incremental allocation and preemption by recompute (Day 33).

Two halves: the scheduler over plain integers (allocation, victim choice, queue order), then a
small Llama for the claim that matters: a cramped engine and a roomy one give identical tokens.
"""

from __future__ import annotations

import pytest

from nanoserve import LLM, SamplingParams
from nanoserve.bench.sched import run_scheduled
from nanoserve.block_allocator import BlockAllocator
from nanoserve.request import Request, RequestState
from nanoserve.scheduler import Scheduler

W, R, F = RequestState.WAITING, RequestState.RUNNING, RequestState.FINISHED


def req(i, prompt_len=5, max_tokens=24):
    return Request(i, [7] * prompt_len, max_tokens=max_tokens)


def inc(num_blocks, slots=4, block_size=4, **kw):
    return Scheduler(BlockAllocator(num_blocks, block_size), slots, allocation="incremental",
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
    s = Scheduler(BlockAllocator(64, 4), 4, allocation="reserve")
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
    assert s.blocks_needed_for(b) == s.allocator.blocks_for_length(4 + len(b.output_token_ids))


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
    assert not out.preempted and s.allocator.num_free == 0
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
    assert s.allocator.num_free == 7 and s.preemptions > 0


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
    pool = cramped.engine.allocator
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
