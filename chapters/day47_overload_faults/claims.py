"""Day 47's numbers: a burst past max_waiting, a forward that raises, an engine thread that dies.

One real server on 127.0.0.1 (``chapters/day38_server/live.py``): nanoserve-tiny in float32
behind ``build_app``, uvicorn on a free port in a thread, 4 slots, a 256-block pool of
block_size 4, ``max_waiting=4``. Three phases, in this order:

1. **overload**: four long greedy requests (160 tokens, EOS ignored) take the four slots; then a
   seeded burst of 16 greedy requests arrives at once from 16 connections;
2. **a fault**: four greedy requests of 64 tokens (two streamed) run together, and the engine's
   test hook (``Engine.fail_on_step``) makes the second step after they are all running raise;
   then four ordinary requests;
3. **a dead engine thread**: ``core.step`` is replaced by a function that raises, the next
   request kills the thread, and three answers follow.

The reference for every greedy text is the offline engine, ``LLM`` on the same checkpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
import time

from chapters.day38_server.claims import _metrics
from chapters.day46_bad_input.snapshot.cases import error_shape_ok
from chapters.runner import exact, timed

from .snapshot.admission import replay

SLOTS, MAX_WAITING, BURST = 4, 4, 16
LONG = 160  # tokens each long request holds its slot for
WORDS = "for while if try with class def import return yield lambda pass".split()


def burst_jobs(seed: int = 47) -> list[tuple[str, int]]:
    """The seeded burst: (prompt, max_tokens), greedy with EOS ignored."""
    rng = random.Random(seed)
    return [(f"The {rng.choice(WORDS)} {rng.choice(WORDS)} statement", rng.randint(6, 16))
            for _ in range(BURST)]


FAULTED = [([0, 9 + i, 6, 7], 64) for i in range(4)]  # two plain, two streamed
AFTER = [(f"The {w} statement", 12) for w in ("for", "while", "class", "yield")]


def _greedy(prompt, n: int, **kw) -> dict:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


def shaped(status: int, body: bytes) -> bool:
    """OpenAI's error object with code == status and no traceback (any status)."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (set(err) == {"message", "type", "param", "code"} and err["code"] == status
            and b"Traceback" not in body)


def _overload(live) -> dict:
    import httpx

    r: dict = {"long_done": []}
    eng = live.engine

    def long(i: int) -> None:
        httpx.post(live.url + "/v1/completions", json=_greedy([0, 30 + i, 6], LONG),
                   timeout=120, trust_env=False)
        r["long_done"].append(time.perf_counter())

    threads = [threading.Thread(target=long, args=(i,)) for i in range(SLOTS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while eng.num_running < SLOTS and time.monotonic() < deadline:
        time.sleep(0.002)
    added = eng.core.counters.requests_added
    refused_at: list[float] = []

    async def one(c, prompt, n):
        resp = await c.post("/v1/completions", json=_greedy(prompt, n))
        if resp.status_code == 429:
            refused_at.append(time.perf_counter())
        return resp

    async def burst():
        limits = httpx.Limits(max_connections=BURST)
        async with httpx.AsyncClient(base_url=live.url, timeout=120, limits=limits,
                                     trust_env=False) as c:
            return await asyncio.gather(*(one(c, p, n) for p, n in burst_jobs()))

    replies = asyncio.run(burst())
    for t in threads:
        t.join(120)
    r["opened"] = eng.core.counters.requests_added - added
    r["replies"] = [(x.status_code, x.headers.get("retry-after"), x.content) for x in replies]
    r["held"] = sum(t > max(refused_at) for t in r["long_done"]) if refused_at else 0
    return r


def _fault(live) -> dict:
    import httpx

    eng, hook = live.engine, live.engine.core.engine
    r: dict = {"plain": {}, "streamed": {}}
    failed = eng.core.counters.requests_failed

    def plain(i: int) -> None:
        resp = httpx.post(live.url + "/v1/completions", json=_greedy(*FAULTED[i]), timeout=60,
                          trust_env=False)
        r["plain"][i] = (resp.status_code, resp.content)

    def streamed(i: int) -> None:
        with httpx.stream("POST", live.url + "/v1/completions", timeout=60, trust_env=False,
                          json=_greedy(*FAULTED[i], stream=True)) as resp:
            lines = [x for x in resp.iter_lines() if x.startswith("data: ")]
            r["streamed"][i] = (resp.status_code, lines)

    threads = [threading.Thread(target=plain, args=(i,)) for i in (0, 1)]
    threads += [threading.Thread(target=streamed, args=(i,)) for i in (2, 3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while eng.num_running < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    hook.fail_on_step = frozenset({hook.steps + 2})  # every one of the four is in that step
    for t in threads:
        t.join(60)
    hook.fail_on_step = frozenset()
    r["failed"] = eng.core.counters.requests_failed - failed
    live.idle()
    r["pool"] = (live.pool.num_free, live.pool.num_blocks)
    with httpx.Client(base_url=live.url, timeout=60, trust_env=False) as c:
        r["after"] = [c.post("/v1/completions", json=_greedy(p, n)) for p, n in AFTER]
        r["after"] = [(x.status_code, x.json()) for x in r["after"]]
        r["health"] = c.get("/health").status_code
        r["metrics"] = _metrics(c.get("/metrics").text)
    return r


def _dead(live) -> dict:
    import httpx

    def broken():
        raise RuntimeError("the core is broken")

    live.engine.core.step = broken  # the thread dies on its next iteration; it is not restored
    out, took = [], []
    with httpx.Client(base_url=live.url, timeout=10, trust_env=False) as c:
        for method, path, body in (("POST", "/v1/completions", _greedy("The for", 4)),
                                   ("GET", "/health", None),
                                   ("POST", "/v1/completions", _greedy("The while", 4))):
            t = time.perf_counter()
            try:
                resp = c.request(method, path, json=body)
                out.append((resp.status_code, resp.content))
            except httpx.TimeoutException:
                out.append((None, b""))
            took.append(time.perf_counter() - t)
    return {"answers": out, "slowest": max(took), "alive": live.engine.is_running}


@functools.cache
def reference() -> dict:
    """The offline engine's greedy text for every prompt the claims check."""
    from chapters.common import SHIPPED, one_thread
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    jobs = burst_jobs() + FAULTED + AFTER
    with one_thread():  # two threads on a busy 2-core machine can be ten times slower
        llm = LLM(SHIPPED, dtype="float32", max_num_seqs=len(jobs))
        outs = llm.generate([p for p, _ in jobs], [
            SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in jobs])
    return {_key(p, n): o.text for (p, n), o in zip(jobs, outs, strict=True)}


def _key(prompt, n: int) -> str:
    return json.dumps([prompt, n])


@functools.cache
def run() -> dict:
    from chapters.day38_server.live import live_server

    with live_server(max_num_seqs=SLOTS, num_kv_blocks=256, block_size=4,
                     max_waiting=MAX_WAITING) as live:
        r = {"overload": _overload(live)}
        live.idle()
        r["fault"] = _fault(live)
        r["dead"] = _dead(live)
    return r


# ---------------------------------------------------------------------------- overload

def burst_codes() -> str:
    codes = [s for s, _, _ in run()["overload"]["replies"]]
    return f"{codes.count(200)}, {codes.count(429)}"


def retry_after() -> str:
    refused = [ra for s, ra, _ in run()["overload"]["replies"] if s == 429]
    return f"{sum(ra == '1' for ra in refused)} of {len(refused)}"


def refusals_shaped() -> str:
    refused = [(s, b) for s, _, b in run()["overload"]["replies"] if s == 429]
    return f"{sum(error_shape_ok(s, b) for s, b in refused)} of {len(refused)}"


def admitted_equal() -> str:
    ref = reference()
    got = [(_key(p, n), json.loads(b)["choices"][0]["text"])
           for (p, n), (s, _, b) in zip(burst_jobs(), run()["overload"]["replies"], strict=True)
           if s == 200]
    return f"{sum(ref[k] == text for k, text in got)} of {len(got)}"


def frozen_burst(count_inbox: bool) -> str:
    admitted, refused, peak = replay("a" * BURST, MAX_WAITING, count_inbox)
    return f"{admitted}, {refused}"


# ---------------------------------------------------------------------------- the fault

def plain_500() -> str:
    plain = run()["fault"]["plain"].values()
    ok = sum(s == 500 and shaped(s, b) and b"injected fault" in b for s, b in plain)
    return f"{ok} of {len(plain)}"


def stream_ends(lines: list[str]) -> bool:
    """One error event (code 500), right before the one data: [DONE], which is last."""
    if len(lines) < 2 or lines[-1] != "data: [DONE]" or lines.count("data: [DONE]") != 1:
        return False
    events = [json.loads(x[6:]) for x in lines[:-1]]
    errors = [i for i, e in enumerate(events) if "error" in e]
    return errors == [len(events) - 1] and events[-1]["error"]["code"] == 500


def streams_ok() -> str:
    streams = run()["fault"]["streamed"].values()
    return f"{sum(s == 200 and stream_ends(lines) for s, lines in streams)} of {len(streams)}"


def streamed_prefix() -> str:
    ref, n = reference(), 0
    streams = run()["fault"]["streamed"]
    for i, (_, lines) in streams.items():
        text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines[:-1]
                       if '"choices"' in x)
        n += ref[_key(*FAULTED[i])].startswith(text)
    return f"{n} of {len(streams)}"


def after_fault() -> str:
    ref, f = reference(), run()["fault"]
    ok = sum(s == 200 and body["choices"][0]["text"] == ref[_key(p, n)]
             for (p, n), (s, body) in zip(AFTER, f["after"], strict=True))
    return f"{ok} of {len(AFTER)}, {f['health']}"


def errors_counted() -> str:
    m = run()["fault"]["metrics"]
    return f"{m.get('nanoserve:request_success_total{finished_reason=error}', 0):g}"


# ---------------------------------------------------------------------------- the dead thread

def dead_codes() -> str:
    return ", ".join(str(s) for s, _ in run()["dead"]["answers"])


CLAIMS = [
    exact("the burst of 16 against 4 held slots, max_waiting 4: 200s, 429s", burst_codes),
    exact("long requests still holding their slots at the burst's last 429",
          lambda: run()["overload"]["held"], fmt="{} of 4".format),
    exact("429s carrying Retry-After: 1", retry_after),
    exact("429s in OpenAI's error shape", refusals_shaped),
    exact("admitted answers equal to the offline engine's greedy text", admitted_equal),
    exact("engine requests opened by the burst", lambda: run()["overload"]["opened"]),
    exact("frozen door, 16 arrivals in one iteration: admitted, refused",
          lambda: frozen_burst(True)),
    exact("frozen door counting only the scheduler's queue: admitted, refused",
          lambda: frozen_burst(False)),
    exact("requests failed by the faulted step", lambda: run()["fault"]["failed"]),
    exact("non-streamed: 500 in the error shape, naming the injected fault", plain_500),
    exact("streamed: 200, then one error event (code 500), then data: [DONE]", streams_ok),
    exact("streamed text before the error, a prefix of the offline text", streamed_prefix),
    exact("blocks in the pool after the fault", lambda: "{} of {}".format(
        *run()["fault"]["pool"])),
    exact("request_success_total, finished_reason error", errors_counted),
    exact("after the fault: requests equal to the offline text, then /health", after_fault),
    exact("engine thread dead: a completion, /health, another completion", dead_codes),
    exact("those three in an error shape, without a traceback",
          lambda: sum(s is not None and shaped(s, b) for s, b in run()["dead"]["answers"]),
          fmt="{} of 3".format),
    timed("slowest of those three answers, 2-core CPU", lambda: run()["dead"]["slowest"],
          fmt=lambda s: f"{s * 1e3:.0f} ms"),
]
