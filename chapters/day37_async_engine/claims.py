"""Day 37's numbers: the async engine on nanoserve-tiny (float32, greedy, EOS ignored,
block_size 4, a 64-block pool, 4 slots), driven from one asyncio event loop.

Every claim but the last is a count. The engine thread's work is counted by wrapping methods
on the instances (``core.abort_request``, ``core.has_unfinished``, ``engine.step``) from outside:
nothing in the package changes, and the wrappers only record.
"""

from __future__ import annotations

import asyncio
import functools
import time

from chapters.common import SHIPPED, one_thread
from chapters.day36_engine_core.claims import WORKLOAD, greedy, joined
from chapters.runner import bound, exact, timed

SHAPE = dict(dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=4)
CANCELS, BURST, MAX_WAITING = 4, 10, 4


def new_llm(**kw):
    from nanoserve import LLM

    return LLM(SHIPPED, **(SHAPE | kw))


async def stream(engine, rid: str, ids: list[int], params) -> list:
    return [d async for d in engine.generate(ids, params, rid)]


async def settle(cond, timeout: float = 10.0) -> bool:
    """Wait on the loop, bounded, until ``cond()`` holds."""
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    return cond()


# ---------------------------------------------------------------- one engine's life


async def _life(e) -> dict:
    core, pool = e.core, e.core.scheduler.kv_cache_manager
    got: dict = {}

    # 1. the workload's 12 requests as concurrent streams
    got["streams"] = joined([d for d in await asyncio.gather(
        *(stream(e, f"r{i}", ids, greedy(m, stop)) for i, (ids, m, stop) in
          enumerate(WORKLOAD)))])

    # 2. cancelled consumers, one at a time, each alone in the engine
    posted, landed = {}, {}
    abort, abort_request = e.abort, core.abort_request

    def post(rid):  # the loop's side: under the lock, so no iteration can slip between
        with e._cond:
            posted[rid] = e.iterations
            abort(rid)

    def land(rid):  # the engine thread's side, inside the inbox hand-over
        done = abort_request(rid)
        landed[rid] = (e.iterations, pool.num_free == pool.num_blocks)
        return done

    e.abort, core.abort_request = post, land
    try:
        for k in range(CANCELS):
            seen = []

            async def consume(k=k, seen=seen):
                async for d in e.generate([9 + k] * 7, greedy(200), f"c{k}"):
                    seen.append(d)

            drains = e.drain_checks
            task = asyncio.create_task(consume())
            await settle(lambda seen=seen: len(seen) >= 3)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await settle(lambda drains=drains: e.drain_checks > drains)
    finally:
        del e.abort, core.abort_request
    got["cancel_lag"] = [landed[r][0] - posted[r] for r in posted]
    got["cancel_clean"] = sum(landed[r][1] for r in posted)

    # 3. idle: the thread must wait on its condition, not poll. Counting starts once it is
    # parked in Condition.wait (CPython keeps the parked threads in the condition's _waiters).
    await settle(lambda: len(e._cond._waiters) == 1)
    calls, has_unfinished = [0], core.has_unfinished

    def counted():
        calls[0] += 1
        return has_unfinished()

    before = e.iterations
    core.has_unfinished = counted
    await asyncio.sleep(0.3)
    del core.has_unfinished
    got["idle"] = (e.iterations - before, calls[0])

    # 4. a burst against max_waiting, with every slot taken by a long request
    from nanoserve.async_engine import Overloaded

    hogs = [e.generate([20 + i] * 3, greedy(200), f"hog{i}") for i in range(4)]
    for h in hogs:
        await h.__anext__()  # each holds a slot now
    e.max_waiting = MAX_WAITING
    refused, accepted = 0, []
    for i in range(BURST):
        g = e.generate([30 + i] * 4, greedy(5), f"burst{i}")
        first = asyncio.create_task(g.__anext__())
        await asyncio.sleep(0)  # it reaches the door before the next one knocks
        if first.done() and isinstance(first.exception(), Overloaded):
            refused += 1
        else:
            accepted.append((g, first))
    e.max_waiting = None
    for h in hogs:
        await h.aclose()  # hang up: the slots go to the waiting burst
    reasons = []
    for g, first in accepted:
        deltas = [await first] + [d async for d in g]
        reasons.append(deltas[-1].finish_reason)
    got["burst"] = (refused, reasons)

    # 5. shutdown lets in-flight requests finish, then refuses
    from nanoserve.async_engine import EngineDead

    tasks = [asyncio.create_task(stream(e, f"late{i}", [40 + i] * 3, greedy(8)))
             for i in range(3)]
    await asyncio.sleep(0.01)
    await e.shutdown(timeout=30)
    ends = [(await t)[-1].finish_reason for t in tasks]
    try:
        await stream(e, "after", [5], greedy(1))
        after = "accepted"
    except EngineDead:
        after = "EngineDead"
    got["shutdown"] = (ends, after, pool.num_free == pool.num_blocks)
    return got


@functools.cache
def life() -> dict:
    from nanoserve.async_engine import AsyncLLM

    with one_thread():
        e = AsyncLLM(new_llm().core)
        e.start()
        try:
            return asyncio.run(asyncio.wait_for(_life(e), 120))
        finally:
            e.stop()


@functools.cache
def offline() -> list:
    with one_thread():
        return new_llm().generate([ids for ids, _, _ in WORKLOAD],
                                  [greedy(m, stop) for _, m, stop in WORKLOAD])


def stream_mismatches() -> str:
    s = life()["streams"]
    bad = sum((s[f"r{i}"]["tokens"], s[f"r{i}"]["text"]) != (o.token_ids, o.text)
              for i, o in enumerate(offline()))
    return f"{bad} of {len(WORKLOAD)}"


def finished_per_stream() -> str:
    counts = [j["finished"] for j in life()["streams"].values()]
    return f"{sum(c == 1 for c in counts)} of {len(counts)}"


# ---------------------------------------------------------------- a thread that dies


@functools.cache
def death() -> str:
    """Three streams running; then the core's step raises. Each stream must get EngineDead,
    and so must a request made afterwards."""
    from nanoserve.async_engine import AsyncLLM, EngineDead

    async def main(e):
        seen = [0]
        streams = [e.generate([50 + i] * 3, greedy(200), f"d{i}") for i in range(3)]
        firsts = [asyncio.create_task(s.__anext__()) for s in streams]
        for f in firsts:
            await f

        def broken():
            raise RuntimeError("injected")

        e.core.step = broken
        for s in streams:
            try:
                async for _ in s:
                    pass
            except EngineDead:
                seen[0] += 1
        try:
            await stream(e, "later", [5], greedy(1))
            later = "accepted"
        except EngineDead:
            later = "EngineDead"
        return f"{seen[0]} of 3, then {later}"

    with one_thread():
        e = AsyncLLM(new_llm().core)
        e.start()
        return asyncio.run(asyncio.wait_for(main(e), 60))


# ---------------------------------------------------------------- the loop keeps breathing


def loop_stall_ratio() -> float:
    """Longest lateness of a 1 ms heartbeat on the event loop while the engine thread runs a
    4 x 256-token prefill, over that prefill's own time (both from one run, best of 3)."""
    from nanoserve.async_engine import AsyncLLM

    e = AsyncLLM(new_llm(num_kv_blocks=512).core)
    e.start()
    forwards, step = [], e.core.engine.step

    def timed_step(out):
        t = time.perf_counter()
        try:
            return step(out)
        finally:
            forwards.append(time.perf_counter() - t)

    e.core.engine.step = timed_step

    async def once(n: int) -> float:
        late, done = [0.0], asyncio.Event()

        async def beat():
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                late[0] = max(late[0], time.perf_counter() - t - 0.001)

        hb = asyncio.create_task(beat())
        forwards.clear()
        await asyncio.gather(*(stream(e, f"t{n}.{i}", [60 + i] * 256, greedy(2))
                               for i in range(4)))
        done.set()
        await hb
        return late[0] / max(forwards)

    async def main():
        return min([await once(n) for n in range(3)])

    try:
        with one_thread():
            return asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        e.stop()


CLAIMS = [
    exact("concurrent streams whose tokens or text differ from LLM.generate's",
          stream_mismatches),
    exact("streams that ended with exactly one finished delta", finished_per_stream),
    exact("cancelled consumers whose request's blocks were all back when its abort landed",
          lambda: f"{life()['cancel_clean']} of {len(life()['cancel_lag'])}"),
    bound("engine iterations from an abort being posted to its blocks back, worst of 4",
          lambda: max(life()["cancel_lag"])),
    exact("while idle for 0.3 s: engine iterations, calls to core.has_unfinished()",
          lambda: "{} iterations, {} calls".format(*life()["idle"])),
    exact("requests refused with Overloaded in a burst of 10 (4 slots busy, max_waiting 4)",
          lambda: life()["burst"][0]),
    exact("finish reasons of the burst's accepted requests",
          lambda: ", ".join(life()["burst"][1])),
    exact("in-flight streams at shutdown: finish reasons, then a new request",
          lambda: "{}; then {}".format(", ".join(life()["shutdown"][0]),
                                      life()["shutdown"][1])),
    exact("pool after shutdown", lambda: "full" if life()["shutdown"][2] else "blocks held"),
    exact("streams told EngineDead when the engine thread dies, then a new request", death),
    timed("longest event-loop stall while the engine thread prefills, / that prefill's time",
          loop_stall_ratio, fmt="{:.3f}x".format),
]
