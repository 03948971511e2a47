"""The token budget and chunked prefill (Day 41) against the whole-prompt engine they replace.

A step spends ``max_num_batched_tokens``: every running decode one token first, then prompt
tokens first come first served, the last prompt cut to what is left. The text never changes:
greedy outputs in float32 are identical with chunking on and off, at the smallest legal budget
(1 token, one row), at budgets that are not a multiple of the block size, with one-token blocks,
under preemption and under aborts. The scheduler's own rules are checked directly on a pool and
a queue; every drain ends with every block back in the pool.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoserve import LLM, SamplingParams
from nanoserve.config import ConfigError, EngineConfig
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request, RequestState
from nanoserve.engine.scheduler import Scheduler

GREEDY = SamplingParams(max_tokens=12, temperature=0)
LENGTHS = (3, 40, 100, 7, 61)  # prompt lengths: short, long, odd


def prompts(lengths=LENGTHS, offset: int = 5) -> list[list[int]]:
    return [[1] + [offset + (7 * i + j) % 200 for j in range(n - 1)]
            for i, n in enumerate(lengths)]


@pytest.fixture(scope="module")
def whole():
    """The reference: whole prompts, prefill and decode in separate forwards."""
    llm = LLM(dtype="float32", enable_chunked_prefill=False)
    return [o.token_ids for o in llm.generate(prompts(), GREEDY)]


def run(**options) -> tuple[list[list[int]], LLM]:
    llm = LLM(dtype="float32", **options)
    out = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
    llm.core.check_drained()
    return out, llm


@pytest.mark.parametrize("options", [
    dict(max_num_batched_tokens=1, max_num_seqs=1),  # the smallest legal budget
    dict(max_num_batched_tokens=5, max_num_seqs=4, block_size=1),  # one-token blocks
    dict(max_num_batched_tokens=13, block_size=4),  # not a multiple of the block size
    dict(max_num_batched_tokens=64, max_num_seqs=3),
    dict(max_num_batched_tokens=9, attention="reference"),
    dict(max_num_batched_tokens=9, prefill="padded"),
    dict(max_num_batched_tokens=9, allocation="reserve"),
    dict(max_num_batched_tokens=16, num_kv_blocks=36, block_size=4, max_num_seqs=4),  # preempts
])
def test_chunked_text_is_the_whole_prompt_text(whole, options):
    got, _ = run(**options)
    assert got == whole


def test_preemption_of_half_prefilled_requests_keeps_the_text(whole):
    got, llm = run(max_num_batched_tokens=7, num_kv_blocks=30, block_size=4, max_num_seqs=4)
    assert llm.core.scheduler.preemptions > 0  # the case is exercised, not assumed
    assert got == whole


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(1, 48), block_size=st.sampled_from([1, 3, 4, 16]),
       seqs=st.integers(1, 4), lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4))
def test_random_budgets_never_change_the_text(budget, block_size, seqs, lengths):
    if budget < seqs:
        seqs = budget
    ps = prompts(lengths, offset=11)
    sp = SamplingParams(max_tokens=6, temperature=0)
    ref = LLM(dtype="float32", block_size=block_size, enable_chunked_prefill=False)
    llm = LLM(dtype="float32", block_size=block_size, max_num_seqs=seqs,
              max_num_batched_tokens=budget)
    assert ([o.token_ids for o in llm.generate(ps, sp)]
            == [o.token_ids for o in ref.generate(ps, sp)])
    llm.core.check_drained()


def test_one_forward_carries_chunks_and_decodes():
    """Two prompts of 10 at a budget of 8, 3 tokens each: a's first chunk (8); a's last 2
    with b's first 6; a's decode with b's last 4 (the mixed step); then two decode steps.
    Five steps, five forwards: never a second forward for the decodes."""
    llm = LLM(dtype="float32", max_num_batched_tokens=8, max_num_seqs=2)
    sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    seen = []
    core = llm.core
    for i, p in enumerate(prompts((10, 10))):
        core.add_request(str(i), p, sp)
    while core.has_unfinished():
        out_before = core.engine.forward_passes
        core.step()
        seen.append(core.engine.forward_passes - out_before)
    assert [n for n in seen if n] == [1, 1, 1, 1, 1]  # the last step only reports
    core.check_drained()


# ---------------------------------------------------------------------------- the scheduler

def request(i: int, n: int, max_tokens: int = 4) -> Request:
    return Request(str(i), list(range(1, n + 1)), max_tokens)


def emit(out) -> None:
    """What the engine does after a step: a token for each request the step samples."""
    for r in out.sampled:
        r.append_token(7)


def test_decodes_first_then_prompts_first_come_first_served_the_last_cut():
    s = Scheduler(KVCacheManager(64, 4), 4, allocation="incremental",
                  max_num_batched_tokens=10)
    a, b = request(0, 3), request(1, 3)
    s.add(a)
    s.add(b)
    emit(s.schedule())  # both whole: 6 tokens
    c, d = request(2, 20), request(3, 5)
    s.add(c)
    s.add(d)
    out = s.schedule()
    assert out.decode == [a, b]  # every running decode, first
    assert [(ch.request, ch.start, ch.n) for ch in out.chunks] == [(c, 0, 8)]  # cut to 8
    assert out.num_batched_tokens == 10 and d.state is RequestState.WAITING
    assert out.sampled == [a, b]  # c is mid-prompt: no token yet
    emit(out)
    out = s.schedule()
    assert [(ch.request, ch.start, ch.n) for ch in out.chunks] == [(c, 8, 8)]
    assert s.blocked_on_budget >= 1
    s.check_invariants()


def test_without_chunking_a_prompt_waits_whole_for_the_budget():
    s = Scheduler(KVCacheManager(64, 4), 4, allocation="incremental",
                  max_num_batched_tokens=10, chunked_prefill=False)
    a, b = request(0, 6), request(1, 6)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert [ch.request for ch in out.chunks] == [a] and not out.mixed  # b does not fit whole
    assert b.state is RequestState.WAITING


def test_a_prompt_longer_than_the_budget_is_served_in_chunks():
    llm = LLM(dtype="float32", max_num_batched_tokens=16, max_num_seqs=2)
    (out,) = llm.generate([prompts((200,))[0]], SamplingParams(max_tokens=3, temperature=0))
    assert len(out.token_ids) == 3
    llm.core.check_drained()


def test_an_aborted_half_prefilled_request_gives_every_block_back():
    llm = LLM(dtype="float32", max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    core = llm.core
    r = core.add_request("long", prompts((100,))[0], GREEDY)
    core.step()
    assert 0 < r.num_computed_tokens < r.num_tokens and r.blocks  # mid-prefill, holding blocks
    assert core.abort_request("long")
    core.step()
    core.check_drained()


def test_no_token_before_the_last_chunk():
    llm = LLM(dtype="float32", max_num_batched_tokens=8, max_num_seqs=2)
    core = llm.core
    r = core.add_request("p", prompts((30,))[0], GREEDY)
    firsts = []
    while not r.output_token_ids:
        core.step()
        firsts.append(r.num_computed_tokens)
    assert firsts == [8, 16, 24, 30]  # four chunks; the token comes with the last
    while core.has_unfinished():
        core.step()
    core.check_drained()


def test_decode_only_steps_still_replay_a_window():
    llm = LLM(dtype="float32", max_num_batched_tokens=16, cuda_graphs=True)
    llm.generate(prompts(), GREEDY)
    snap = llm.core.snapshot()
    assert snap.decode_steps_replayed > 0


# ---------------------------------------------------------------------------- the options

def test_a_budget_below_max_num_seqs_is_refused_naming_both():
    with pytest.raises(ConfigError, match="max_num_batched_tokens=4 is below max_num_seqs=8"):
        EngineConfig(max_num_batched_tokens=4, max_num_seqs=8)
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(KVCacheManager(8, 4), 8, max_num_batched_tokens=4)


def test_without_chunking_the_budget_must_hold_the_longest_prompt():
    with pytest.raises(ValueError, match="below max_model_len=512"):
        LLM(dtype="float32", max_model_len=512, max_num_batched_tokens=256,
            enable_chunked_prefill=False)
    cfg = EngineConfig(enable_chunked_prefill=False)
    assert cfg.resolve_max_num_batched_tokens(4096) == 4096  # the default grows to fit


def test_the_flags_are_vllms():
    import argparse

    p = argparse.ArgumentParser()
    EngineConfig.add_cli_args(p)
    ns = p.parse_args(["--max-num-batched-tokens", "256", "--no-enable-chunked-prefill"])
    cfg = EngineConfig.from_cli_args(ns)
    assert (cfg.max_num_batched_tokens, cfg.enable_chunked_prefill) == (256, False)
    assert EngineConfig.from_cli_args(p.parse_args([])).enable_chunked_prefill is True


def test_without_chunking_a_scheduler_refuses_what_could_never_fit_whole():
    from nanoserve.validation import InvalidRequest

    s = Scheduler(KVCacheManager(64, 4), 4, max_num_batched_tokens=8, chunked_prefill=False)
    with pytest.raises(InvalidRequest, match="past the step budget of 8") as e:
        s.add(request(0, 10))
    assert e.value.param == "max_tokens" and not s.waiting
    s.add(request(1, 4))  # 4 + 4 fits whole
