"""Day 39's numbers: streams, hang-ups and the pool, against a real server on 127.0.0.1.

The server (``chapters/day38_server/live.py``): nanoserve-tiny in float32 behind ``build_app``,
uvicorn on a free port of 127.0.0.1 in a thread, 4 slots, a 256-block pool of block_size 4.
Six requests are sent twice, streamed and not; then four streaming clients hang up after three
events and four non-streaming clients hang up after 0.3 s (a read timeout), each asking for 200
tokens with EOS ignored (while they wait, a step takes at least ``STEP_FLOOR_S``, so their
answers cannot be finished first on a fast machine). ``abort`` and ``abort_request`` are wrapped
to record when the server asked and when the engine gave the blocks back.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time

from chapters.day38_server.claims import _metrics
from chapters.runner import bound, exact, timed

from .snapshot.sse import ClientGone, events, frame, until_disconnect

STORY = [{"role": "user", "content": "Tell me a story."}]
PAIRS = [  # (path, body): each sent streamed and not streamed
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}),
    ("/v1/completions", {"prompt": "The function", "max_tokens": 24, "temperature": 0}),
    ("/v1/completions", {"prompt": [0, 5, 77, 300], "max_tokens": 16, "temperature": 0,
                         "ignore_eos": True}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9,
                         "seed": 11}),
    ("/v1/chat/completions", {"messages": STORY, "max_tokens": 8, "temperature": 0}),
    ("/v1/chat/completions", {"messages": STORY, "max_tokens": 16, "temperature": 0.9,
                              "seed": 3}),
]
HANGUPS = 4  # of each kind
# While the non-streaming clients wait, each engine step takes at least this long, so their
# 200-token answers need 200 steps, at least 1 s, and cannot be done before the 0.3 s read
# timeout on any machine: the row counts hang-ups, not how fast this machine decodes.
STEP_FLOOR_S = 0.005
ABORTED = "nanoserve:request_success_total{finished_reason=abort}"


def _text(ev: dict) -> str:
    ch = ev["choices"][0]
    return ch.get("text") or (ch.get("delta") or {}).get("content") or ""


def _whole(resp: dict) -> tuple[str, list[int]]:
    ch = resp["choices"][0]
    return (ch.get("text") if "text" in ch else ch["message"]["content"]), ch["token_ids"]


@functools.cache
def run() -> dict:
    import httpx

    from chapters.day38_server.live import live_server

    r: dict = {"pairs": [], "hangups": [], "calls": {}, "freed": {}}
    with live_server(max_num_seqs=4, num_kv_blocks=256, block_size=4) as live:
        c = httpx.Client(base_url=live.url, timeout=60, trust_env=False)
        for path, body in PAIRS:
            body = {**body, "return_token_ids": True}
            whole = c.post(path, json=body).json()
            raw = b""
            with c.stream("POST", path, json={**body, "stream": True,
                                              "stream_options": {"include_usage": True}}) as s:
                for b in s.iter_raw():
                    raw += b
            r["pairs"].append((path, whole, raw.decode()))

        eng, core = live.engine, live.engine.core
        ask, give = eng.abort, core.abort_request

        def abort(rid):  # the server asks (from the event loop)
            r["calls"].setdefault(rid, (time.perf_counter(), eng.iterations))
            ask(rid)

        def abort_request(rid):  # the engine thread acts, at the top of an iteration
            before = live.pool.num_free
            ok = give(rid)
            if ok:
                r["freed"][rid] = (eng.iterations, live.pool.num_free - before)
            return ok

        eng.abort, core.abort_request = abort, abort_request

        def streaming(i: int) -> None:
            body = {"prompt": [0, 20 + i, 6, 7], "max_tokens": 200, "ignore_eos": True,
                    "temperature": 0, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as s:
                seen = 0
                for line in s.iter_lines():
                    seen += line.startswith("data:")
                    if seen == 3:
                        break
                r["hangups"].append(("stream", time.perf_counter()))
            # leaving the block unread closes the connection: the client has hung up

        def blocking(i: int) -> None:
            body = {"prompt": [0, 40 + i, 6, 7], "max_tokens": 200, "ignore_eos": True,
                    "temperature": 0}
            with httpx.Client(base_url=live.url, timeout=httpx.Timeout(60, read=0.3),
                              trust_env=False) as cc:
                try:
                    cc.post("/v1/completions", json=body)
                    r["hangups"].append(("finished", time.perf_counter()))
                except httpx.ReadTimeout:
                    r["hangups"].append(("blocking", time.perf_counter()))

        step = core.step

        def paced_step():
            t0 = time.perf_counter()
            out = step()
            time.sleep(max(0.0, STEP_FLOOR_S - (time.perf_counter() - t0)))
            return out

        for kind in (streaming, blocking):
            if kind is blocking:
                core.step = paced_step
            threads = [threading.Thread(target=kind, args=(i,)) for i in range(HANGUPS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            live.idle()
        del core.step  # the instance's own attribute: the class's step again
        r["idle"] = live.idle()
        r["metrics"] = _metrics(c.get("/metrics").text)
        r["pool"] = (live.pool.num_free, live.pool.num_blocks)
        eng.abort, core.abort_request = ask, give
        c.close()
    return r


def chat_stream_shape() -> str:
    """role, content, usage, [DONE] counts in the greedy 8-token chat stream."""
    evs = events(run()["pairs"][4][2])
    role = sum(1 for e in evs if e != "[DONE]" and e["choices"]
               and e["choices"][0]["delta"].get("role"))
    content = sum(1 for e in evs if e != "[DONE]" and e["choices"] and _text(e))
    usage = sum(1 for e in evs if e != "[DONE]" and e.get("usage"))
    return f"{role}, {content}, {usage}, {evs.count('[DONE]')}"


def well_formed(raw: str) -> bool:
    evs = events(raw)
    finishes = [e for e in evs if e != "[DONE]" for ch in e["choices"] if ch["finish_reason"]]
    return len(finishes) == 1 and evs.count("[DONE]") == 1 and evs[-1] == "[DONE]"


def joined(raw: str) -> tuple[str, list[int]]:
    evs = [e for e in events(raw) if e != "[DONE]" and e["choices"]]
    ids = [t for e in evs for t in (e["choices"][0].get("token_ids") or [])]
    return "".join(_text(e) for e in evs), ids


def same_text() -> int:
    return sum(joined(raw)[0] == _whole(w)[0] for _, w, raw in run()["pairs"])


def same_ids() -> int:
    return sum(joined(raw)[1] == _whole(w)[1] for _, w, raw in run()["pairs"])


def same_usage() -> int:
    n = 0
    for _, w, raw in run()["pairs"]:
        last = [e for e in events(raw) if e != "[DONE]" and e.get("usage")]
        n += len(last) == 1 and last[0]["usage"] == w["usage"]
    return n


def hangups() -> str:
    kinds = [k for k, _ in run()["hangups"]]
    return f"{kinds.count('stream')}, then {kinds.count('blocking')}"


def worst_iterations() -> float:
    """Engine iterations between the server's abort() and the request's blocks being freed."""
    r = run()
    gaps = [r["freed"][rid][0] - it for rid, (_, it) in r["calls"].items() if rid in r["freed"]]
    assert len(gaps) == 2 * HANGUPS, gaps
    return max(gaps)


def worst_latency() -> float:
    """Seconds from the last hang-up of a wave to the server's last abort() of that wave."""
    r = run()
    calls = sorted(t for t, _ in r["calls"].values())
    hang = sorted(t for _, t in r["hangups"])
    assert len(calls) == len(hang) == 2 * HANGUPS
    return max(max(calls[:HANGUPS]) - max(hang[:HANGUPS]),
               max(calls[HANGUPS:]) - max(hang[HANGUPS:]))


def rebuilt() -> str:
    """The greedy chat stream's exact bytes, re-framed by the frozen snapshot from its events."""
    raw = run()["pairs"][4][2]
    again = "".join(frame(e) if e != "[DONE]" else "data: [DONE]\n\n" for e in events(raw))
    return f"identical ({len(raw.encode())} bytes)" if again == raw else "different"


def frozen_watcher() -> str:
    """The frozen watcher over 10 s of pending work, with a client that leaves at the 3rd ask."""
    asks = 0
    work = None

    async def gone() -> bool:
        nonlocal asks
        asks += 1
        return asks >= 3

    async def main():
        nonlocal work
        work = asyncio.ensure_future(asyncio.sleep(10))
        try:
            await until_disconnect(gone, work, poll=0.01)
        except ClientGone:
            await asyncio.sleep(0)
            return "cancelled" if work.cancelled() else "still running"
        return "finished"

    outcome = asyncio.run(main())
    return f"{asks}, {outcome}"


def idle_gauges() -> str:
    m = run()["metrics"]
    return ", ".join(f"{m[f'nanoserve:{k}']:g}" for k in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"))


CLAIMS = [
    exact("events in the greedy 8-token chat stream: role, content, usage, [DONE]",
          chat_stream_shape),
    exact("streams with one finish_reason and one [DONE], [DONE] last",
          lambda: sum(well_formed(raw) for _, _, raw in run()["pairs"]), fmt="{} of 6".format),
    exact("streams whose joined text equals the non-streamed text", same_text,
          fmt="{} of 6".format),
    exact("streams whose token ids equal the non-streamed ids", same_ids, fmt="{} of 6".format),
    exact("streams whose usage chunk equals the non-streamed usage", same_usage,
          fmt="{} of 6".format),
    exact("clients that hung up: streaming, then non-streaming", hangups),
    exact("engine requests aborted (nanoserve:request_success_total, abort)",
          lambda: f"{run()['metrics'].get(ABORTED, 0):g}"),
    bound("iterations from the server's abort() to the blocks freed, worst of 8",
          worst_iterations),
    exact("blocks in the pool after the 8 hang-ups", lambda: "{} of {}".format(*run()["pool"])),
    exact("running, waiting, KV-cache usage on /metrics once idle", idle_gauges),
    exact("a live stream re-framed by the frozen snapshot", rebuilt),
    exact("frozen watcher, client gone at the 3rd ask: asks, then the pending work",
          frozen_watcher),
    timed("hang-up to the server's abort(), worst wave, 2-core CPU", worst_latency,
          fmt=lambda s: f"{s * 1e3:.0f} ms"),
]
