"""The live package held against the Day 36 and Day 37 snapshots: the same tokens, text, deltas
and counts on a fixed workload that exercises staggered arrivals, stop strings, preemption,
aborts and a failing forward, and the same streams through both async engines."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from chapters.common import SHIPPED, one_thread
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day36_engine_core.claims import (
    CRAMPED,
    WORKLOAD,
    add_package,
    add_snapshot,
    drive,
    greedy,
    joined,
)
from chapters.day36_engine_core.snapshot.core import EngineCore as SnapshotCore
from chapters.day37_async_engine.snapshot.async_engine import AsyncEngine
from nanoserve import LLM
from nanoserve.async_engine import AsyncLLM
from nanoserve.tokenizer import IncrementalDetokenizer, Tokenizer


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def snap_model():
    return load_model(SHIPPED)


def package():
    return LLM(SHIPPED, **CRAMPED)


def snapshot(model, tokenizer):
    return SnapshotCore(model, CRAMPED["num_kv_blocks"], CRAMPED["block_size"],
                        CRAMPED["max_num_seqs"],
                        detokenizer=lambda ids: IncrementalDetokenizer(tokenizer, ids))


def test_package_core_equals_day36_snapshot(snap_model):
    llm = package()
    mine = drive(llm.core, add_package)
    snap = snapshot(snap_model, llm.tokenizer)
    theirs = drive(snap, add_snapshot)
    a, b = joined(mine), joined(theirs)
    assert a == b and len(a) == len(WORKLOAD)
    assert [len(s) for s in mine] == [len(s) for s in theirs]  # deltas step by step
    e, s = llm.engine, llm.core.scheduler
    assert (llm.core.counters.iterations, e.forward_passes, e.row_steps, s.preemptions,
            s.recomputed_tokens) == (snap.iterations, snap.forward_passes, snap.row_steps,
                                     snap.scheduler.preemptions,
                                     snap.scheduler.recomputed_tokens)
    assert s.preemptions > 0 and {j["reason"] for j in a.values()} >= {"abort", "stop",
                                                                          "length"}
    assert all(j["finished"] == 1 for j in a.values())


def test_a_failing_forward_fails_the_same_requests(snap_model, monkeypatch):
    llm = package()
    snap = snapshot(snap_model, llm.tokenizer)
    calls = {"package": 0, "snapshot": 0}
    real_step, real_forward = llm.engine.step, snap._forward

    def flaky_step(out):
        calls["package"] += 1
        if calls["package"] == 9:
            raise RuntimeError("injected")
        return real_step(out)

    def flaky_forward(group, tokens):  # the snapshot's 9th iteration, first forward
        if snap.iterations == 9 and calls["snapshot"] < 1:
            calls["snapshot"] += 1
            raise RuntimeError("injected")
        return real_forward(group, tokens)

    monkeypatch.setattr(llm.engine, "step", flaky_step)
    monkeypatch.setattr(snap, "_forward", flaky_forward)
    a, b = joined(drive(llm.core, add_package)), joined(drive(snap, add_snapshot))
    assert a == b
    assert sum(j["reason"] == "error" for j in a.values()) >= 1


def test_package_async_engine_streams_equal_day37_snapshot(snap_model):
    async def streams(gen):
        async def one(i, ids, m, stop):
            return [d async for d in gen(f"r{i}", ids, m, stop)]
        return joined(await asyncio.gather(*(one(i, *w) for i, w in enumerate(WORKLOAD))))

    llm = package()
    live = AsyncLLM(llm.core)
    snap = AsyncEngine(snapshot(snap_model, llm.tokenizer)).start()
    try:
        a = asyncio.run(asyncio.wait_for(streams(
            lambda rid, ids, m, stop: live.generate(ids, greedy(m, stop), rid)), 60))
        b = asyncio.run(asyncio.wait_for(streams(snap.generate), 60))
        for _ in range(2000):  # the step after the last token releases its blocks
            if snap.drains:
                break
            time.sleep(0.001)
    finally:
        live.stop()
        snap.stop()
    assert {k: (j["tokens"], j["text"], j["finished"]) for k, j in a.items()} == \
        {k: (j["tokens"], j["text"], j["finished"]) for k, j in b.items()}
    assert snap.drains >= 1 and snap.core.pool.num_free == snap.core.pool.num_blocks


def test_day37_snapshot_sleeps_while_idle_and_aborts_on_cancel(snap_model):
    from chapters.day37_async_engine.snapshot.async_engine import Overloaded

    tok = Tokenizer.from_dir(SHIPPED)
    eng = AsyncEngine(snapshot(snap_model, tok), max_waiting=0).start()

    async def main():
        with pytest.raises(Overloaded):  # max_waiting 0: nothing may wait
            await anext_of(eng.generate("no", [5, 6], 3))
        eng.max_waiting = None
        got = []

        async def consume():
            async for d in eng.generate("c", [5, 6, 7], 40):
                got.append(d)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(2000):
            if eng.drains:
                break
            await asyncio.sleep(0.001)
        before = (eng.iterations, eng.wakeups)
        await asyncio.sleep(0.3)
        return before, (eng.iterations, eng.wakeups)

    async def anext_of(gen):
        return await gen.__anext__()

    try:
        before, after = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        eng.stop()
    assert before == after  # no iteration and no wake-up while idle
    pool = eng.core.pool
    assert pool.num_free == pool.num_blocks and not eng.core.live
    with torch.inference_mode():
        eng.core.check_drained()
