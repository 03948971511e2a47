# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 37 notebook: the engine core on a thread, streams on the loop
#
# On a CPU, in well under half a minute, with the live `nanoserve.async_engine.AsyncLLM` over
# the shipped nanoserve-tiny model (float32, greedy, EOS ignored, block_size 4, 4 slots):
#
# 1. twelve concurrent streams on one event loop, against `LLM.generate`;
# 2. the loop's heartbeat while the engine thread runs a long prefill, and while the same
#    prefill runs on the loop itself;
# 3. a consumer cancelled mid-stream, and how fast its blocks come back;
# 4. an idle engine thread, counted;
# 5. a burst against `max_waiting`;
# 6. a dying engine thread, and shutdown;
# 7. the Day 37 snapshot's streams against the package's.

# %%
import asyncio
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day36_engine_core.claims import WORKLOAD, greedy, joined
from chapters.day36_engine_core.snapshot.core import EngineCore
from chapters.day37_async_engine.claims import settle, stream
from chapters.day37_async_engine.snapshot.async_engine import AsyncEngine
from nanoserve import LLM
from nanoserve.async_engine import AsyncLLM, EngineDead, Overloaded
from nanoserve.bench import run_sync
from nanoserve.tokenizer import IncrementalDetokenizer

torch.set_num_threads(1)
SHAPE = dict(dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=4)
offline_llm = LLM(SHIPPED, **SHAPE)
engine = AsyncLLM.from_options(SHIPPED, **SHAPE)
engine.start()
pool = engine.core.scheduler.kv_cache_manager

# %% [markdown]
# ## 1. Twelve streams, one loop
#
# Day 36's workload (12 requests, seed 36, every third with the stop string `" the"`), each
# request consumed by its own coroutine with `async for`. The order in which deltas arrive on
# the loop shows the batching: each engine iteration hands out one delta per running request.

# %%
arrivals = []


async def consume(i, ids, m, stop):
    out = []
    async for d in engine.generate(ids, greedy(m, stop), f"r{i}"):
        arrivals.append(d.request_id)
        out.append(d)
    return out


async def twelve():
    return await asyncio.gather(*(consume(i, *w) for i, w in enumerate(WORKLOAD)))


streams = joined(run_sync(twelve()))
offline = offline_llm.generate([ids for ids, _, _ in WORKLOAD],
                               [greedy(m, stop) for _, m, stop in WORKLOAD])
bad = [i for i, o in enumerate(offline)
       if (streams[f"r{i}"]["tokens"], streams[f"r{i}"]["text"]) != (o.token_ids, o.text)]
print("first deltas to arrive:", " ".join(arrivals[:16]), "...")
print(f"streams that differ from generate: {len(bad)} of 12; engine iterations "
      f"{engine.iterations}, drain checks passed {engine.drain_checks}")

# %% [markdown]
# ## 2. The loop keeps breathing
#
# A 1 ms heartbeat on the loop measures how late it wakes. First the engine thread prefills four
# 200-token prompts while the loop beats; then the same work is done by stepping a core on the
# loop itself, which is what a server without the thread would do.

# %%
prompts = [[60 + i] * 200 for i in range(4)]


async def heartbeat(done: asyncio.Event, late: list):
    while not done.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - t - 0.001)


async def on_thread():
    done, late = asyncio.Event(), []
    hb = asyncio.create_task(heartbeat(done, late))
    t = time.perf_counter()
    await asyncio.gather(*(stream(engine, f"p{i}", p, greedy(2)) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t
    done.set()
    await hb
    return max(late), wall


async def on_loop():
    core = offline_llm.core
    done, late = asyncio.Event(), []
    hb = asyncio.create_task(heartbeat(done, late))
    await asyncio.sleep(0.005)
    for i, p in enumerate(prompts):
        core.add_request(f"q{i}", p, greedy(2))
    t = time.perf_counter()
    with torch.inference_mode():
        while core.has_unfinished():
            core.step()              # blocks the loop for the whole forward
            await asyncio.sleep(0)   # then lets it run once
    wall = time.perf_counter() - t
    done.set()
    await hb
    return max(late), wall


for name, run in (("engine thread", on_thread), ("on the loop", on_loop)):
    worst, wall = run_sync(run())
    print(f"{name:>13}: requests took {wall * 1e3:6.1f} ms; the loop's worst lateness "
          f"{worst * 1e3:6.1f} ms")

# %% [markdown]
# On the thread, the loop wakes within a few milliseconds even in the middle of the prefill:
# torch releases the GIL while it computes, so the loop thread gets it. On the loop, the
# heartbeat waits for the whole forward.
#
# ## 3. A consumer that leaves
#
# A request wants 200 tokens; its consumer is cancelled after three deltas. The generator's
# `finally` posts an abort to the inbox; the engine thread takes the inbox at the top of its
# next iteration, and the blocks are back before that iteration's forward.

# %%
async def leave():
    got = []

    async def consumer():
        async for d in engine.generate([9] * 7, greedy(200), "gone"):
            got.append(d)

    task = asyncio.create_task(consumer())
    await settle(lambda: len(got) >= 3)
    held, at = pool.num_held, engine.iterations
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await settle(lambda: pool.num_held == 0 and "gone" not in engine.core.requests)
    return len(got), held, engine.iterations - at


n, held, lag = run_sync(leave())
print(f"cancelled after {n} deltas, holding {held} blocks; {lag} iteration(s) from the cancel "
      f"to the abort's report; blocks held now {pool.num_held}")

# %% [markdown]
# ## 4. Idle means asleep
#
# With nothing to do the thread waits on a condition variable. Counting calls of the core's
# `has_unfinished` (the predicate its wait loop checks) for 0.3 s shows it is not polling.

# %%
calls, real = [0], engine.core.has_unfinished


def counted():
    calls[0] += 1
    return real()


run_sync(settle(lambda: len(engine._cond._waiters) == 1))  # parked in Condition.wait
before = engine.iterations
engine.core.has_unfinished = counted
time.sleep(0.3)
del engine.core.has_unfinished
print(f"in 0.3 s idle: {engine.iterations - before} iterations, {calls[0]} predicate checks")

# %% [markdown]
# ## 5. A burst against `max_waiting`
#
# Four long requests take every slot; then ten short ones knock with `max_waiting=4`. The
# waiting count is the inbox plus the scheduler's queue, read under the lock the engine thread
# takes the inbox under, so the first four get in and the rest are refused with `Overloaded`,
# however the thread's iterations fall between them.

# %%
async def burst():
    hogs = [engine.generate([20 + i] * 3, greedy(200), f"hog{i}") for i in range(4)]
    for h in hogs:
        await h.__anext__()
    engine.max_waiting = 4
    refused, kept = 0, []
    for i in range(10):
        g = engine.generate([30 + i] * 4, greedy(5), f"b{i}")
        first = asyncio.create_task(g.__anext__())
        await asyncio.sleep(0)  # it reaches the door before the next one knocks
        if first.done() and isinstance(first.exception(), Overloaded):
            refused += 1
        else:
            kept.append((g, first))
    print(f"refused {refused}, accepted {len(kept)}; waiting {engine.num_waiting}")
    engine.max_waiting = None
    for h in hogs:
        await h.aclose()  # the hogs hang up; the four accepted get their slots
    for g, first in kept:
        deltas = [await first] + [d async for d in g]
        print(f"  {deltas[-1].request_id}: {len(deltas)} deltas, {deltas[-1].finish_reason}")


run_sync(burst())

# %% [markdown]
# ## 6. Death and shutdown
#
# A second engine whose core's `step` raises on its first call: the stream gets `EngineDead`,
# and so does every request after it. Then the first engine shuts down with three requests in
# flight; they finish, and a new request is refused.

# %%
dead = AsyncLLM(offline_llm.core)


def broken():
    raise RuntimeError("injected")


dead.core.step = broken
dead.start()


async def die():
    for rid in ("x", "y"):
        try:
            await stream(dead, rid, [5, 6], greedy(3))
        except EngineDead as e:
            print(f"{rid}: EngineDead: {e}")


run_sync(die())


async def shut():
    tasks = [asyncio.create_task(stream(engine, f"late{i}", [40 + i] * 3, greedy(8)))
             for i in range(3)]
    await asyncio.sleep(0.01)
    await engine.shutdown(timeout=30)
    ends = [(await t)[-1].finish_reason for t in tasks]
    try:
        await stream(engine, "after", [5], greedy(1))
    except EngineDead as e:
        ends.append(f"then: {e}")
    return ends


print(run_sync(shut()), "| pool full:", pool.num_free == pool.num_blocks)

# %% [markdown]
# ## 7. The snapshot's streams
#
# The Day 37 snapshot is the same design over the Day 36 snapshot core. Its twelve streams
# carry the same tokens and text as the package's.

# %%
tok = offline_llm.tokenizer
snap = AsyncEngine(EngineCore(load_model(SHIPPED), 64, 4, 4,
                              detokenizer=lambda ids: IncrementalDetokenizer(tok, ids))).start()


async def snap_twelve():
    async def one(i, ids, m, stop):
        return [d async for d in snap.generate(f"r{i}", ids, m, stop)]
    return joined(await asyncio.gather(*(one(i, *w) for i, w in enumerate(WORKLOAD))))


theirs = run_sync(snap_twelve())
time.sleep(0.05)
snap.stop()
same = sum((streams[k]["tokens"], streams[k]["text"]) == (theirs[k]["tokens"], theirs[k]["text"])
           for k in streams)
print(f"streams identical to the package's: {same} of 12; snapshot iterations "
      f"{snap.iterations}, wake-ups {snap.wakeups}, drains {snap.drains}")
