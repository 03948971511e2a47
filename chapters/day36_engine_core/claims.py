"""Day 36's numbers: the long-lived engine core, counted on nanoserve-tiny (float32, greedy,
EOS ignored, block_size 4). Every claim is an exact count; none reads a clock.

The fixed workload (``WORKLOAD``): 12 requests drawn with seed 36, prompts of 2-20 random token
ids, 1-30 tokens each, every third with the stop string " the". ``drive`` adds request i before
step 2i, so arrivals land while others run, and aborts r4 at step 14 and r9 at step 24. Through a
16-block pool and 4 slots it preempts, so the comparison of the package's core with the Day 36
snapshot's covers admission, growth, preemption, resume, abort and stop strings at once.
"""

from __future__ import annotations

import functools
import random

import torch

from chapters.common import DAY29_MAX_TOKENS, DAY29_PROMPTS, SHIPPED, one_thread
from chapters.runner import exact

from .snapshot.core import EngineCore as SnapshotCore

CRAMPED = dict(dtype="float32", block_size=4, num_kv_blocks=16, max_num_seqs=4,
               enable_chunked_prefill=False)  # Day 36 counts whole-prompt steps
ABORTS = {14: "r4", 24: "r9"}  # step -> request aborted just before it
STOP_PROMPT, STOP = 'The "while" statement is used', "while_stmt"


def workload(n: int = 12, seed: int = 36) -> list[tuple[list[int], int, tuple[str, ...]]]:
    """(prompt ids, max_tokens, stop strings) per request."""
    rng = random.Random(seed)
    return [([rng.randrange(2, 2048) for _ in range(rng.randint(2, 20))], rng.randint(1, 30),
             (" the",) if i % 3 == 0 else ()) for i in range(n)]


WORKLOAD = workload()


def measured(fn):
    """Cached, and on one torch thread: on a small shared CPU a second thread mostly waits
    for a core, and the counts do not depend on it."""
    @functools.cache
    @functools.wraps(fn)
    def run(*args):
        with one_thread():
            return fn(*args)
    return run


def greedy(max_tokens: int, stop=()):
    from nanoserve import SamplingParams

    return SamplingParams(max_tokens=max_tokens, stop=list(stop), temperature=0,
                          ignore_eos=True)


def drive(core, add, work=WORKLOAD, aborts=ABORTS, spacing: int = 2) -> list[list]:
    """Add request i before step ``spacing * i``, abort as ``aborts`` says, step until the core
    is drained; the deltas of every step, in order. ``add(core, id, ids, max_tokens, stop)``."""
    steps: list[list] = []
    i = 0
    with torch.inference_mode():
        while i < len(work) or core.has_unfinished():
            while i < len(work) and len(steps) >= spacing * i:
                add(core, f"r{i}", *work[i])
                i += 1
            if len(steps) in aborts:
                core.abort_request(aborts[len(steps)])
            steps.append(core.step())
    core.check_drained()
    return steps


def add_package(core, rid, ids, max_tokens, stop):
    core.add_request(rid, ids, greedy(max_tokens, stop))


def add_snapshot(core, rid, ids, max_tokens, stop):
    core.add_request(rid, ids, max_tokens, stop)


def joined(steps: list[list]) -> dict[str, dict]:
    """Per request: the deltas joined (tokens, text), how many deltas, how many finished."""
    out: dict[str, dict] = {}
    for deltas in steps:
        for d in deltas:
            j = out.setdefault(d.request_id, {"tokens": [], "text": "", "deltas": 0,
                                              "finished": 0, "reason": None})
            j["tokens"] += d.new_token_ids
            j["text"] += d.new_text
            j["deltas"] += 1
            j["finished"] += d.finished
            j["reason"] = d.finish_reason or j["reason"]
    return out


@functools.cache
def llm():
    """One LLM for the chapter's whole run: one core, as long-lived as the engine."""
    from nanoserve import LLM

    return LLM(SHIPPED, **CRAMPED)


@functools.cache
def snapshot_model():
    from chapters.day01_llama_forward.snapshot.weights import load_model

    return load_model(SHIPPED)


# ---------------------------------------------------------------- one request at a time


@measured
def staggered() -> tuple[list, dict]:
    """The workload without aborts, once through generate(), then added one at a time to the
    same LLM's core (the same core generate() just used)."""
    lm = llm()
    offline = lm.generate([ids for ids, _, _ in WORKLOAD],
                          [greedy(m, stop) for _, m, stop in WORKLOAD])
    return offline, joined(drive(lm.core, add_package, aborts={}))


def stream_mismatches() -> str:
    offline, streams = staggered()
    bad = sum((streams[f"r{i}"]["tokens"], streams[f"r{i}"]["text"]) != (o.token_ids, o.text)
              for i, o in enumerate(offline))
    return f"{bad} of {len(offline)}"


def deltas_and_tokens() -> str:
    _, streams = staggered()
    return (f"{sum(s['deltas'] for s in streams.values())} deltas for "
            f"{sum(len(s['tokens']) for s in streams.values())} tokens")


def finished_deltas() -> str:
    """Requests whose joined stream carries exactly one finished delta, of all requests."""
    streams = staggered()[1].values()
    return f"{sum(s['finished'] == 1 for s in streams)} of {len(streams)}"


def pool_after_drain() -> str:
    staggered()
    pool = llm().core.scheduler.kv_cache_manager
    return f"{pool.num_free} of {pool.num_blocks}"


@measured
def duplicate_id() -> str:
    """A live id is refused; once its request has finished, the id is free again."""
    core = llm().core
    seen = []
    core.add_request("dup", [5, 6, 7], greedy(3))
    try:
        core.add_request("dup", [5, 6], greedy(3))
        seen.append("accepted")
    except ValueError:
        seen.append("refused")
    drive(core, add_package, work=[], aborts={})
    core.add_request("dup", [5, 6], greedy(2))
    seen.append("accepted")
    drive(core, add_package, work=[], aborts={})
    return ", then ".join(seen)


# ---------------------------------------------------------------- stop strings


@measured
def stop_stream() -> tuple[int, int]:
    """Characters beyond the final text that a stream shows before the cut: without the
    hold-back (the detokenizer's text as it grows), then with it (the joined deltas)."""
    lm = llm()
    ids = lm.tokenizer.encode(STOP_PROMPT)
    final = lm.generate([ids], greedy(30, [STOP]))[0].text
    core = lm.core
    r = core.add_request("stop", ids, greedy(30, [STOP]))
    naive = held = 0
    streamed = ""
    with torch.inference_mode():
        while core.has_unfinished():
            for d in core.step():
                streamed += d.new_text
            if not r.is_finished:
                naive = max(naive, len(r.detokenizer.text) - len(final))
            held = max(held, len(streamed) - len(final))
    assert streamed == final and r.finish_reason == "stop"
    return naive, held


# ---------------------------------------------------------------- aborts and failures


@measured
def aborted_mid_run() -> dict:
    """Four requests running; after three steps two are aborted. Blocks are read from the pool
    before and right after the aborts, with no step in between."""
    core = llm().core
    pool = core.scheduler.kv_cache_manager
    reqs = [core.add_request(f"a{i}", [3 + i] * 5, greedy(40)) for i in range(4)]
    steps = []
    with torch.inference_mode():
        for _ in range(3):
            steps.append(core.step())
        held = sum(len(r.blocks) for r in reqs[:2])
        free_before = pool.num_free
        aborted = [core.abort_request(r.request_id) for r in reqs[:2]]
        returned = pool.num_free - free_before
    assert all(aborted)
    streams = joined(steps + drive(core, add_package, work=[], aborts={}))
    return {"held": held, "returned": returned,
            "reasons": [streams[r.request_id]["reason"] for r in reqs]}


@measured
def failing_forward() -> dict:
    """Six requests, four slots: the second forward raises. The four running requests end with
    "error"; the two waiting ones run after it and finish normally."""
    core = llm().core
    engine, pool = core.engine, core.scheduler.kv_cache_manager
    real, calls = engine.step, [0]

    def flaky(out):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected")
        return real(out)

    for i in range(6):
        core.add_request(f"f{i}", [7 + i] * 5, greedy(6))
    engine.step = flaky
    steps, held_after = [], None
    try:
        with torch.inference_mode():
            while core.has_unfinished():
                steps.append(core.step())
                if calls[0] == 2 and held_after is None:
                    held_after = pool.num_held
    finally:
        del engine.step  # the instance attribute goes; the class's method is back
    core.check_drained()
    reasons = [s["reason"] for s in joined(steps).values()]
    return {"reasons": reasons, "held_after": held_after}


# ---------------------------------------------------------------- package vs snapshot


COUNTS = ("iterations", "forward passes", "row-steps", "deltas", "preemptions",
          "tokens recomputed")


def _package_counts(lm, deltas: int = 0) -> tuple:
    e, s = lm.engine, lm.core.scheduler
    return (lm.core.counters.iterations, e.forward_passes, e.row_steps, deltas, s.preemptions,
            s.recomputed_tokens)


@measured
def package_run() -> tuple[dict, tuple]:
    """The workload through the chapter's long-lived core; its counters are read as the
    difference across the run, so what the core did before does not count."""
    lm = llm()
    before = _package_counts(lm)
    steps = drive(lm.core, add_package)
    after = _package_counts(lm, sum(map(len, steps)))
    return joined(steps), tuple(a - b for a, b in zip(after, before, strict=True))


@measured
def snapshot_run() -> tuple[dict, tuple]:
    from nanoserve.tokenizer import IncrementalDetokenizer

    tok = llm().tokenizer
    core = SnapshotCore(snapshot_model(), CRAMPED["num_kv_blocks"], CRAMPED["block_size"],
                        CRAMPED["max_num_seqs"],
                        detokenizer=lambda ids: IncrementalDetokenizer(tok, ids))
    steps = drive(core, add_snapshot)
    s = core.scheduler
    counts = (core.iterations, core.forward_passes, core.row_steps, core.deltas,
              s.preemptions, s.recomputed_tokens)
    return joined(steps), counts


def same_streams() -> str:
    a, b = package_run()[0], snapshot_run()[0]
    return f"{sum(a[k] == b.get(k) for k in a)} of {len(WORKLOAD)}"


# ---------------------------------------------------------------- Day 31, three times


@measured
def day31_calls() -> str:
    """One LLM, three generate() calls of the Day 29 shape: each call's tokens, row-steps and
    finish iterations against the Day 31 snapshot's run."""
    from chapters.day31_engine.snapshot.scheduled import run_scheduled
    from nanoserve import LLM

    snap = run_scheduled(snapshot_model(), DAY29_PROMPTS, DAY29_MAX_TOKENS, 4, 64, 8)
    lm = LLM(SHIPPED, dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=8)
    params = [greedy(m) for m in DAY29_MAX_TOKENS]
    same = 0
    for _ in range(3):
        before = lm.stats.row_steps
        outs = lm.generate(DAY29_PROMPTS, params)
        same += ([o.token_ids for o in outs] == [r.token_ids for r in snap.replies]
                 and lm.stats.row_steps - before == snap.issued
                 and [o.finish_iteration for o in outs] ==
                 [r.finish_iteration for r in snap.replies])
    return f"{same} of 3"


CLAIMS = [
    exact("requests added one per step whose streamed tokens or text differ from "
          "LLM.generate's", stream_mismatches),
    exact("deltas handed out, staggered run", deltas_and_tokens),
    exact("requests that got exactly one finished delta", finished_deltas),
    exact("pool after the drain, free of total blocks", pool_after_drain),
    exact("a live duplicate id, then the same id after it finished", duplicate_id),
    exact("characters past the final text shown before a stop-string cut: without hold-back, "
          "then with", lambda: "{}, then {}".format(*stop_stream())),
    exact("blocks back from aborting 2 of 4 running requests, before any further step",
          lambda: "{returned} of the {held} they held".format(**aborted_mid_run())),
    exact("finish reasons of the 4, in order", lambda: ", ".join(aborted_mid_run()["reasons"])),
    exact("finish reasons when the second forward raises (4 slots, 6 requests)",
          lambda: ", ".join(failing_forward()["reasons"])),
    exact("blocks held right after the failing step", lambda: failing_forward()["held_after"]),
    exact("requests with identical deltas, package core vs Day 36 snapshot", same_streams),
    exact(", ".join(COUNTS) + ": Day 36 snapshot",
          lambda: ", ".join(map(str, snapshot_run()[1]))),
    exact("the same six counts: package core", lambda: ", ".join(map(str, package_run()[1]))),
    exact("generate() calls on one LLM that reproduce Day 31's run", day31_calls),
]
