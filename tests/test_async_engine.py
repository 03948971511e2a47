"""The async engine (Day 37): the core on a background thread, one asyncio stream per request,
aborts on cancel, a bounded waiting room, and a thread that sleeps while there is no work."""

from __future__ import annotations

import asyncio
import time

import pytest

from chapters.common import SHIPPED
from nanoserve import LLM, SamplingParams
from nanoserve.async_engine import AsyncLLM, EngineDead, Overloaded

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLM.from_options(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64,
                     max_num_seqs=4)
    e.start()
    yield e
    e.stop()


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def collect(engine, ids, params, rid):
    return [d async for d in engine.generate(ids, params, rid)]


def pool_full(engine) -> bool:
    snap = engine.snapshot()
    return snap.num_free_blocks == snap.num_blocks


def wait_for(cond, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_concurrent_streams_equal_generate(engine):
    prompts = [[5, 6, 7], [9] * 11, [30, 31], [40] * 5, [50] * 7, [60, 61, 62, 63]]
    params = [SamplingParams(max_tokens=4 + 3 * i, **GREEDY) for i in range(len(prompts))]
    want = LLM(SHIPPED, dtype="float32", block_size=4, max_num_seqs=4).generate(prompts, params)
    with pytest.raises(RuntimeError, match="driven by an AsyncLLM"):
        engine.core.run_to_completion()  # one driver per core: LLM.generate steps this way

    async def main():
        pairs = enumerate(zip(prompts, params, strict=True))
        return await asyncio.gather(*(collect(engine, p, sp, f"c{i}") for i, (p, sp) in pairs))

    for deltas, w in zip(run(main()), want, strict=True):
        assert [t for d in deltas for t in d.new_token_ids] == w.token_ids
        assert deltas[-1].finished and sum(d.finished for d in deltas) == 1
    assert wait_for(lambda: pool_full(engine))


def test_cancelling_the_consumer_aborts_and_returns_blocks(engine):
    async def main():
        got = []

        async def consume():
            async for d in engine.generate([7] * 9, SamplingParams(max_tokens=200, **GREEDY),
                                           "gone"):
                got.append(d)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(got)

    assert run(main()) >= 3
    assert wait_for(lambda: pool_full(engine) and not engine.core.requests)
    assert engine.core.counters.by_reason.get("abort", 0) >= 1


def test_a_bad_request_raises_before_anything_is_queued(engine):
    async def main():
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await collect(engine, [10**7], SamplingParams(max_tokens=2), "bad")
    run(main())
    assert "bad" not in engine.core.requests


def test_the_thread_sleeps_while_idle(engine):
    run(collect(engine, [5, 6], SamplingParams(max_tokens=2, **GREEDY), "warm"))
    assert wait_for(lambda: not engine.core.has_unfinished())
    time.sleep(0.1)  # the last step's counters are bumped just after the core empties
    before = (engine.iterations, engine.drain_checks)
    time.sleep(0.3)
    assert (engine.iterations, engine.drain_checks) == before  # no spinning
    assert engine.is_running and engine.drain_checks >= 1


def test_max_waiting_refuses_at_the_door():
    e = AsyncLLM.from_options(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64,
                     max_num_seqs=1, max_waiting=1)
    long, short = (SamplingParams(max_tokens=m, **GREEDY) for m in (60, 3))

    async def main():
        running = e.generate([5, 6], long, "running")
        await running.__anext__()  # it holds the only slot now
        waiting = e.generate([7, 8], short, "waiting")
        queued = asyncio.create_task(waiting.__anext__())
        for _ in range(2000):  # bounded: let the queued request reach the inbox
            if e.num_waiting == 1:
                break
            await asyncio.sleep(0.001)
        assert e.num_waiting == 1
        with pytest.raises(Overloaded) as info:
            await collect(e, [9], short, "refused")
        assert info.value.retry_after >= 1
        await running.aclose()  # the client hangs up: its slot goes to the waiting one
        first = await queued
        rest = [d async for d in waiting]
        return [first] + rest

    deltas = run(main())
    assert deltas[-1].finished and deltas[-1].num_output_tokens == 3
    assert wait_for(lambda: pool_full(e))
    assert "refused" not in e.core.requests
    e.stop()


def test_a_dead_engine_thread_fails_streams_and_new_requests(monkeypatch):
    e = AsyncLLM.from_options(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64,
                              max_num_seqs=2)

    def broken():
        raise RuntimeError("core bug")

    monkeypatch.setattr(e.core, "step", broken)
    e.start()

    async def main():
        with pytest.raises(EngineDead, match="core bug"):
            await collect(e, [5, 6], SamplingParams(max_tokens=2), "x")
        with pytest.raises(EngineDead):
            await collect(e, [5, 6], SamplingParams(max_tokens=2), "y")
    run(main())
    assert e.errored and not e.is_running


def test_a_stop_right_after_the_last_token_still_gives_every_block_back():
    # The last token's step reports the request finished; its blocks go back at the next
    # schedule(). A shutdown that sees no stream left stops the thread before that step:
    # the thread's way out must release them itself. Driven by hand, so the race is certain.
    e = AsyncLLM.from_options(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64,
                              max_num_seqs=2)
    e.core.add(e.core.make_request("last", [5, 6], SamplingParams(max_tokens=3, **GREEDY)))
    while not any(d.finished for d in e.core.step()):
        pass
    assert not pool_full(e)  # finished and reported, blocks still held
    e.stop()  # asked to stop before the thread runs: it takes no step at all
    e.start()
    e.stop()
    assert not e.is_running and pool_full(e)
    e.core.check_drained()


def test_shutdown_lets_in_flight_finish_then_refuses():
    e = AsyncLLM.from_options(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64,
                              max_num_seqs=2)
    e.start()

    async def main():
        task = asyncio.create_task(collect(e, [5, 6], SamplingParams(max_tokens=5, **GREEDY),
                                           "inflight"))
        await asyncio.sleep(0.01)
        await e.shutdown(timeout=30)
        deltas = await task
        with pytest.raises(EngineDead, match="shutting down"):
            await collect(e, [5], SamplingParams(max_tokens=1), "late")
        return deltas

    deltas = run(main())
    assert deltas[-1].finish_reason == "length" and len(deltas) == 5
    assert pool_full(e)
