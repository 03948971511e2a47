"""The engine core (Day 36): one scheduler for the engine's life, requests in and out between
iterations, deltas that add up to the final answer, and nothing leaked after a drain."""

from __future__ import annotations

import pytest
import torch

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED
from nanoserve import LLM, SamplingParams

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=4)


def drain(core, limit=10_000):
    """Step to the end; return every delta, in order."""
    deltas = []
    for _ in range(limit):
        if not core.has_unfinished():
            return deltas
        with torch.inference_mode():
            deltas += core.step()
    raise AssertionError("the core did not drain")


def test_deltas_add_up_to_generate(llm):
    prompts = ["The for statement", "Classes provide", "A tuple"]
    params = SamplingParams(max_tokens=12, **GREEDY)
    want = llm.generate(prompts, params)
    core = llm.core
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", llm.tokenizer.encode(p), params)
    deltas = drain(core)
    for i, w in enumerate(want):
        mine = [d for d in deltas if d.request_id == f"r{i}"]
        assert [t for d in mine for t in d.new_token_ids] == w.token_ids
        assert "".join(d.new_text for d in mine) == w.text
        assert [d.finished for d in mine].count(True) == 1 and mine[-1].finished
        assert mine[-1].finish_reason == "length" and mine[-1].num_output_tokens == 12
    core.check_drained()


def test_stop_string_is_never_streamed_then_taken_back(llm):
    """While a stop string may still match, its first characters are held back."""
    ids = llm.tokenizer.encode('The "while" statement is used')
    free = llm.generate([ids], SamplingParams(max_tokens=30, **GREEDY))[0].text
    stop = free[10:14]  # a string the reply is known to contain
    params = SamplingParams(max_tokens=30, stop=[stop], **GREEDY)
    want = llm.generate([ids], params)[0]
    assert want.finish_reason == "stop" and stop not in want.text
    llm.core.add_request("s", ids, params)
    deltas = drain(llm.core)
    streamed = ""
    for d in deltas:
        streamed += d.new_text
        assert stop not in streamed
    assert streamed == want.text


def test_duplicate_live_id_and_bad_requests_are_refused(llm):
    core = llm.core
    core.add_request("dup", [5, 6, 7], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match="already live"):
        core.add_request("dup", [5, 6], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match="request ids are strings"):
        core.add_request(7, [5, 6], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        core.add_request("v", [5, 10**6], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match="could never run"):
        core.add_request("big", [5] * 10, SamplingParams(max_tokens=400, **GREEDY))
    drain(core)
    core.check_drained()
    core.add_request("dup", [5, 6], SamplingParams(max_tokens=2, **GREEDY))  # free again
    drain(core)


def test_abort_returns_blocks_at_once_and_is_reported_once(llm):
    core, pool = llm.core, llm.core.scheduler.kv_cache_manager
    params = SamplingParams(max_tokens=40, **GREEDY)
    core.add_request("a", [3] * 9, params)
    core.add_request("b", [4] * 9, params)
    with torch.inference_mode():
        core.step()
        core.step()
    held = pool.num_blocks - pool.num_free
    assert core.abort_request("a")
    assert pool.num_blocks - pool.num_free < held  # back before any further step
    assert not core.abort_request("a")  # already finished: a no-op, not an error
    assert not core.abort_request("never-seen")
    deltas = drain(core)
    a = [d for d in deltas if d.request_id == "a"]
    assert len(a) == 1 and a[0].finished and a[0].finish_reason == "abort"
    assert a[0].new_token_ids == []
    core.check_drained()


def test_a_failing_forward_fails_its_requests_and_the_core_lives_on(llm, monkeypatch):
    core, engine = llm.core, llm.engine
    params = SamplingParams(max_tokens=6, **GREEDY)
    core.add_request("x", [3, 4, 5], params)
    core.add_request("y", [6, 7], params)
    real, calls = engine.step, {"n": 0}

    def flaky(out):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected")
        return real(out)

    monkeypatch.setattr(engine, "step", flaky)
    deltas = drain(core)
    ends = {d.request_id: d for d in deltas if d.finished}
    assert {d.finish_reason for d in ends.values()} == {"error"}
    assert "injected" in ends["x"].error
    core.check_drained()
    monkeypatch.setattr(engine, "step", real)
    ok = llm.generate([[3, 4, 5]], params)[0]
    assert len(ok.token_ids) == 6


def test_long_lived_llm_repeats_day31_exactly_on_every_call():
    """One scheduler for the LLM's life: a second and third generate() give the same tokens,
    counts and finish iterations as the Day 31 snapshot, as a fresh LLM does."""
    from chapters.day01_llama_forward.snapshot.weights import load_model as snap_load
    from chapters.day31_engine.snapshot.scheduled import run_scheduled

    snap = run_scheduled(snap_load(SHIPPED), DAY29_PROMPTS, DAY29_MAX_TOKENS, 4, 64, 8)
    llm = LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=8)
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in DAY29_MAX_TOKENS]
    for call in range(3):
        before = (llm.stats.row_steps, llm.stats.generated_tokens)
        outs = llm.generate(DAY29_PROMPTS, params)
        assert [o.token_ids for o in outs] == [r.token_ids for r in snap.replies]
        assert (llm.stats.row_steps - before[0], llm.stats.generated_tokens - before[1]) == \
            (snap.issued, snap.useful)
        assert [o.finish_iteration for o in outs] == [r.finish_iteration for r in snap.replies]
        assert [o.request_id for o in outs] == [str(8 * call + i) for i in range(8)]
    assert llm.core.scheduler.schedule_calls > 0


def test_long_lived_llm_preempts_as_a_fresh_one_does():
    """Preemption counters accumulate over the core's life; per call they match a fresh LLM."""
    kw = dict(dtype="float32", block_size=4, num_kv_blocks=14, max_num_seqs=4,
              skip_tokenizer_init=True)
    prompts = [[7 + i] * (3 + i) for i in range(6)]
    params = SamplingParams(max_tokens=20, **GREEDY)
    fresh = LLM(SHIPPED, **kw)
    want = fresh.generate(prompts, params)
    lived = LLM(SHIPPED, **kw)
    lived.generate(prompts, params)
    outs = lived.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert fresh.stats.preemptions > 0
    assert lived.stats.preemptions == 2 * fresh.stats.preemptions
    assert lived.stats.recomputed_tokens == 2 * fresh.stats.recomputed_tokens


def test_the_fault_hook_fails_one_step_and_nothing_else():
    """LLM(fail_on_step=...) is the test hook: engine step 2 raises; its requests end with
    "error", everything is back in the pool, and later requests are served normally."""
    from nanoserve.engine.engine import InjectedFault

    llm = LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=2,
              fail_on_step=(2,), skip_tokenizer_init=True)
    params = SamplingParams(max_tokens=5, **GREEDY)
    with pytest.raises(RuntimeError, match="2 of 3 requests failed"):
        llm.generate([[3, 4], [5, 6], [7, 8]], params)  # step 2 decodes the first two
    llm.core.check_drained()
    assert llm.engine.fail_on_step == {2} and issubclass(InjectedFault, RuntimeError)
    again = llm.generate([[3, 4], [5, 6], [7, 8]], params)
    fresh = LLM(SHIPPED, dtype="float32", block_size=4, max_num_seqs=2, skip_tokenizer_init=True)
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh.generate(
        [[3, 4], [5, 6], [7, 8]], params)]


def test_a_step_runs_under_inference_mode_whoever_calls_it(llm, monkeypatch):
    """EngineCore.step from plain code (no inference_mode of the caller's): the model still
    runs under inference mode, so no op records an autograd graph (and oneDNN's packed linear
    never picks its training primitive), and the step's text is the one generate gives."""
    core, model = llm.core, llm.engine.model
    seen, real = [], model.forward

    def forward(*a, **k):
        seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return real(*a, **k)
    monkeypatch.setattr(model, "forward", forward)
    params = SamplingParams(max_tokens=5, **GREEDY)
    core.add_request("plain", [3, 4, 5], params)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    tokens = []
    for _ in range(100):
        if not core.has_unfinished():
            break
        tokens += [t for d in core.step() for t in d.new_token_ids]
    core.check_drained()
    assert seen and all(s == (True, False) for s in seen)
    monkeypatch.setattr(model, "forward", real)
    assert tokens == llm.generate([[3, 4, 5]], params)[0].token_ids
