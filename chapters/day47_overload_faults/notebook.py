# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 47 notebook: a burst past the limit, a step that raises, a thread that dies
#
# The Day 38 server on 127.0.0.1 (a free port, a thread of this process; nanoserve-tiny,
# float32, 4 slots, 256 blocks of 4 tokens, `max_waiting=4`). On a 2-core CPU in about ten
# seconds:
#
# 1. the frozen door: a burst counted two ways;
# 2. a live burst of 16 against four busy slots: who gets a 200, who gets a 429;
# 3. the fault hook under a stream and under a plain request;
# 4. an engine thread that dies: every request refused as unavailable, at once.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import asyncio
import threading
import time

import httpx

from chapters.day38_server.live import live_server
from chapters.day47_overload_faults.snapshot.admission import replay
from nanoserve.bench import run_sync


def greedy(prompt, n, **kw):
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw}

# %% [markdown]
# ## 1. The frozen door
#
# `a` is an arrival, `i` an engine iteration (every slot busy, so nothing leaves the queue).
# Counting the inbox and the queue together admits exactly `max_waiting` however the arrivals
# fall; counting only the scheduler's queue depends on where the iterations land.

# %%
for events in ("a" * 16, "aaaa" + "i" + "a" * 12, "aa" + "i" + "a" * 14, "a" + "ia" * 15):
    both = replay(events, max_waiting=4)
    queue_only = replay(events, max_waiting=4, count_inbox=False)
    print(f"{events:32}  inbox+queue (admitted, refused, peak) {both}   queue only {queue_only}")

# %% [markdown]
# ## 2. A live burst
#
# Four long greedy requests take the four slots. Then 16 requests arrive at once. Four fit in
# the waiting room; twelve are told to come back in a second.

# %%
ctx = live_server(max_num_seqs=4, num_kv_blocks=256, block_size=4, max_waiting=4)
live = ctx.__enter__()
print("serving on", live.url)

longs = [threading.Thread(target=httpx.post, args=(live.url + "/v1/completions",),
                          kwargs={"json": greedy([0, 30 + i, 6], 160), "timeout": 120})
         for i in range(4)]
for t in longs:
    t.start()
while live.engine.num_running < 4:
    time.sleep(0.002)
print("running:", live.engine.num_running, "waiting:", live.engine.num_waiting)

words = "for while if try with class def import return yield lambda pass raise del assert global"


async def burst():
    async with httpx.AsyncClient(base_url=live.url, timeout=120,
                                 limits=httpx.Limits(max_connections=16)) as ac:
        return await asyncio.gather(*(ac.post("/v1/completions", json=greedy(
            f"The {w} statement", 8)) for w in words.split()))

replies = run_sync(burst())
for w, r in zip(words.split(), replies, strict=True):
    said = repr(r.json()["choices"][0]["text"]) if r.status_code == 200 else \
        f"Retry-After: {r.headers['retry-after']}  {r.json()['error']['message']}"
    print(f"{w:8} {r.status_code}  {said}")
for t in longs:
    t.join()

# %% [markdown]
# ## 3. A step that raises
#
# `Engine.fail_on_step` is a test hook: a set of step numbers on which the engine's step
# raises `InjectedFault`. Armed for the second step from now, it catches a streamed and a plain
# request in the same batch. The stream has already said 200, so its error arrives as an event,
# followed by `data: [DONE]`; the plain request gets a 500.

# %%
live.idle()
hook = live.engine.core.engine
out = {}


def stream():
    with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                      json=greedy([0, 11, 6, 7], 64, stream=True)) as r:
        out["stream"] = (r.status_code, [x for x in r.iter_lines() if x.startswith("data: ")])


def plain():
    out["plain"] = httpx.post(live.url + "/v1/completions", json=greedy([0, 12, 6, 7], 64),
                              timeout=60)


threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
for t in threads:
    t.start()
while live.engine.num_running < 2:
    time.sleep(0.001)
hook.fail_on_step = frozenset({hook.steps + 2})
for t in threads:
    t.join()
hook.fail_on_step = frozenset()
status, lines = out["stream"]
print("stream:", status, f"{len(lines)} events; the last two:")
for x in lines[-2:]:
    print("   ", x[:150])
print("plain: ", out["plain"].status_code, out["plain"].json())
live.idle()
print("failed so far:", live.engine.core.counters.requests_failed,
      "| blocks free:", live.pool.num_free, "of", live.pool.num_blocks)
print("next request:", httpx.post(live.url + "/v1/completions", json=greedy("The for", 8),
                                  timeout=60).json()["choices"][0]["text"])

# %% [markdown]
# ## 4. A thread that dies
#
# Replace the core's step with one that raises something the core does not contain. The next
# request kills the engine thread; the thread tells every waiting stream, and from then on the
# server refuses everything at once as Service Unavailable, `/health` included. The statuses
# below are what it sends.

# %%


def broken():
    raise RuntimeError("the core is broken")


live.engine.core.step = broken
for method, path, body in (("POST", "/v1/completions", greedy("The for", 4)),
                           ("GET", "/health", None),
                           ("POST", "/v1/completions", greedy("The while", 4))):
    t = time.perf_counter()
    r = httpx.request(method, live.url + path, json=body, timeout=10)
    print(f"{method:4} {path:16} {r.status_code} in {(time.perf_counter() - t) * 1e3:.1f} ms  "
          f"{r.json()['error']['message']}")
print("engine running:", live.engine.is_running, "| error:", repr(live.engine.error))

# %%
ctx.__exit__(None, None, None)
print("stopped")
