"""Day 48's numbers: a reduced soak run here, and the 10,000-request soak read from its record.

The reduced soak is ``run_soak(requests=300, concurrency=32, disconnect_rate=0.2, seed=48,
chat=False)``:
``nanoserve serve`` on the shipped nanoserve-tiny in float32 (8 slots) as a subprocess on a free
port of 127.0.0.1, 32 concurrent clients, a seeded mix of streamed and plain completions of 1 to
24 tokens, half greedy, a fifth of the clients told to hang up mid-flight (``chat=False``: the
shipped model has a chat template since Day 69, and this chapter keeps the completions-only mix
it was recorded with). One seam is added
here: the soak's progress callback also reads the server's RSS after the 100th response, so the
reduced run's memory bound starts early in the run (the soak's own first reading is at the
1,000th response, which a 300-request run never reaches before its end).

The ``recorded`` rows read ``results/soak.json``, written by::

    nanoserve bench soak --requests 10000 --concurrency 64 --disconnect-rate 0.2 --seed 0 \\
        --out chapters/day48_soak/results/soak.json

(recorded before the shipped model had a chat template; ``--no-chat`` gives the same mix now).
"""

from __future__ import annotations

import functools

from chapters.runner import bound, exact, recorded, timed

from .snapshot.verdict import problems

REQUESTS, CLIENTS, RATE, SEED = 300, 32, 0.2, 48
EARLY = 100  # the response after which the reduced run reads the server's RSS
HAND_MADE = {"failed": 0, "mismatches": 2, "stuck_requests": 2, "settled_within_s": None,
             "leaked_blocks_frac": 0.0625, "rss_growth": 0.04}


@functools.cache
def soak() -> dict:
    from chapters.common import one_thread
    from nanoserve.bench import soak as mod

    original, early = mod._soak, {}

    async def watched(base_url, pid, jobs, concurrency, model, progress):
        def each(done: int) -> None:
            if done == EARLY:
                early["rss"] = mod.rss_bytes(pid)
            progress(done)
        return await original(base_url, pid, jobs, concurrency, model, each)

    mod._soak = watched
    try:
        with one_thread():  # the offline reference, in this process
            s = mod.run_soak(requests=REQUESTS, concurrency=CLIENTS, disconnect_rate=RATE,
                             seed=SEED, show_progress=False, chat=False)
    finally:
        mod._soak = original
    jobs = mod.make_jobs(REQUESTS, SEED, RATE, chat=False)
    s["told_to_hang_up"] = sum(j.hang_up_after is not None or j.hang_up_chunks is not None
                               for j in jobs)
    s["rss_early_mb"] = early["rss"] / 2**20
    s["rss_growth_early"] = s["rss_end_mb"] / s["rss_early_mb"] - 1
    s["live_verdict"] = mod.verdict(s)
    return s


def accounted() -> str:
    s = soak()
    return f"{s['completed'] + s['disconnected'] + s['failed']} of {s['requests']}"


def frozen_on_run() -> str:
    s = soak()
    mine = problems(s)
    if mine != s["live_verdict"]:
        return f"different: {mine} vs {s['live_verdict']}"
    return "none, as the live verdict" if not mine else "; ".join(mine)


SOAK = "soak.json"
LONG = "10,000-request soak"

CLAIMS = [
    exact("requests answered or hung up, none unaccounted", accounted),
    exact("clients told to hang up (seeded)", lambda: soak()["told_to_hang_up"]),
    bound("share of those that hung up before their answer was complete",
          lambda: soak()["disconnected"] / soak()["told_to_hang_up"]),
    exact("requests failed", lambda: soak()["failed"]),
    bound("greedy answers compared with the offline engine", lambda: soak()["greedy_completed"]),
    exact("greedy answers that differ from the offline engine's", lambda: soak()["mismatches"]),
    exact("KV-cache usage on /metrics at the end (leaked blocks)",
          lambda: soak()["leaked_blocks_frac"], fmt="{:g}".format),
    exact("requests running or waiting 5 s after the last response",
          lambda: soak()["stuck_requests"]),
    bound("server RSS growth, 100th response to the end",
          lambda: abs(soak()["rss_growth_early"])),
    exact("problems the frozen verdict finds", frozen_on_run),
    exact("the frozen verdict on a hand-made bad record",
          lambda: "; ".join(problems(HAND_MADE))),
    timed("last response to running, waiting and KV usage all 0, 2-core CPU",
          lambda: soak()["settled_within_s"], fmt=lambda s: f"{s * 1e3:.0f} ms"),
    recorded(f"{LONG}: requests", SOAK, "requests", fmt="{:,}".format),
    recorded(f"{LONG}: completed", SOAK, "completed", fmt="{:,}".format),
    recorded(f"{LONG}: disconnected mid-flight", SOAK, "disconnected", fmt="{:,}".format),
    recorded(f"{LONG}: failed", SOAK, "failed"),
    recorded(f"{LONG}: greedy answers that differ from the offline engine's", SOAK,
             "mismatches"),
    recorded(f"{LONG}: KV-cache usage at the end", SOAK, "leaked_blocks_frac",
             fmt="{:g}".format),
    recorded(f"{LONG}: requests stuck 5 s after the last response", SOAK, "stuck_requests"),
    recorded(f"{LONG}: server RSS growth, 1,000th response to the end", SOAK, "rss_growth"),
    recorded(f"{LONG}: wall time, 2-core CPU", SOAK, "wall_s"),
]
