"""Day 65's numbers: what rank 0 sends per forward on a real run, the frozen message format
and journal replay held against the package's, the text under preemption, graphs and prefix
caching, and what a dead worker costs.

Every engine is the shipped nanoserve-tiny in float32; the tp=2 ones spawn one worker process
over gloo on 127.0.0.1, and every one is shut down before its claim returns.
"""

from __future__ import annotations

import functools
import multiprocessing
import re
import time

from chapters.common import SHIPPED
from chapters.runner import exact, timed

from .snapshot import step as frozen

PROMPTS = ["The while statement", "Once upon a time there was", "def f(x):", "A list is",
           "import os\nimport sys\n", "class Stack:", "The quick brown fox jumps over", "x = 1"]
HARD = dict(num_kv_blocks=12, max_num_seqs=4, cuda_graphs=True, enable_prefix_caching=True,
            max_num_batched_tokens=16)  # preempts, replays windows, chunks, hits the cache
SYSTEM = "You are a helpful assistant who answers briefly. " * 2


def _params(n: int = 32):
    from nanoserve import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def records(journal: list[int]):
    """The kind of each record in ``journal``, in order."""
    size = {frozen.RESET: 2, frozen.ADOPT: 3, frozen.MOVE: 3}
    i = 0
    while i < len(journal):
        yield journal[i]
        i += 3 + journal[i + 2] if journal[i] == frozen.EXTEND else size[journal[i]]


@functools.cache
def traced() -> dict:
    """A -tp 2 run of the 8 prompts with every message rank 0 sent, its journal replayed on
    plain tables by the frozen ``apply`` and compared with rank 0's tables as it was sent."""
    from nanoserve import LLM
    from nanoserve.tp import protocol

    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2, max_num_seqs=4) as llm:
        ex, cache = llm.engine.executor, llm.engine.cache
        sent, send = [], ex.send
        tables: dict[int, list[int]] = {}
        agree = {"ints": 0, "tables": 0}

        def spy(m):
            ints = protocol.encode(m)
            mine = frozen.encode(m.kind, m.rows, m.token_lists, sorted(m.hold), m.journal)
            agree["ints"] += ints == mine
            frozen.apply(tables, {}, m.journal)
            agree["tables"] += all(tables.get(r, []) == t.blocks
                                   for r, t in enumerate(cache.tables))
            sent.append(ints)
            send(m)

        ex.send = spy
        ex.comm.stats.reset()
        before = llm.engine.forward_passes
        llm.generate(PROMPTS, _params())
        forwards = llm.engine.forward_passes - before
        calls, nbytes = dict(ex.comm.stats.calls), dict(ex.comm.stats.nbytes)
        pending = list(cache.journal)  # written after the last forward: it waits for the next
    ops = {frozen.EXTEND: 0, frozen.RESET: 0, frozen.ADOPT: 0, frozen.MOVE: 0}
    for ints in sent:
        for op in records(frozen.decode(ints)[4]):
            ops[op] += 1
    return {"sent": sent, "forwards": forwards, "calls": calls, "bytes": nbytes,
            "agree": agree, "ops": ops,
            "pending": list(records(pending)).count(frozen.RESET)}


def per_forward() -> str:
    t = traced()
    tails = sum(frozen.broadcasts(m) - 1 for m in t["sent"])
    return (f"{t['forwards']} forwards, {len(t['sent'])} messages, "
            f"{t['calls']['broadcast']} broadcasts ({tails} tails), "
            f"{t['bytes']['broadcast'] // t['calls']['broadcast']:,} B on average")


def journal_kinds() -> str:
    ops = traced()["ops"]
    return ", ".join(f"{name} {ops[code]}" for name, code in (
        ("EXTEND", frozen.EXTEND), ("RESET", frozen.RESET), ("ADOPT", frozen.ADOPT),
        ("MOVE", frozen.MOVE))) + f"; {traced()['pending']} RESET left for the next forward"


def frozen_agrees() -> str:
    t = traced()
    n = len(t["sent"])
    return f"ints: {t['agree']['ints']} of {n}; tables: {t['agree']['tables']} of {n}"


def logits_to_workers() -> str:
    """Bytes of every broadcast over the run against the messages' own sizes: nothing else
    (no logits, no sampler state) travelled from rank 0 to the workers."""
    t = traced()
    expected = sum(frozen.HEADER * 8 + max(0, len(m) - (frozen.HEADER - 1)) * 8
                   for m in t["sent"])
    return f"{t['bytes']['broadcast'] - expected} B beyond the messages"


@functools.cache
def hard_pair() -> dict:
    from nanoserve import LLM

    prompts = [SYSTEM + p for p in PROMPTS]
    one = LLM(SHIPPED, dtype="float32", **HARD)
    ref = [o.token_ids for o in one.generate(prompts, _params())]
    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2, **HARD) as two:
        got = [o.token_ids for o in two.generate(prompts, _params())]
        s = two.stats
    return {"same": sum(a == b for a, b in zip(got, ref, strict=True)),
            "one": one.stats, "two": s}


def hard() -> str:
    p = hard_pair()
    s, o = p["two"], p["one"]
    return (f"{p['same']} of {len(PROMPTS)} identical; preemptions {s.preemptions} "
            f"(-tp 1: {o.preemptions}); decode steps replayed {s.replay_share:.0%}; prefix "
            f"tokens hit {s.prefix_cache_hits}")


def _workers() -> int:
    return sum(p.name.startswith("nanoserve-tp") and p.is_alive()
               for p in multiprocessing.active_children())


@functools.cache
def killed() -> dict:
    from nanoserve import LLM

    llm = LLM(SHIPPED, dtype="float32", tensor_parallel_size=2, distributed_timeout_s=10)
    try:
        (worker,) = llm.engine.executor.processes
        worker.kill()
        worker.join(5)
        t0 = time.perf_counter()
        try:
            llm.generate(PROMPTS[:2], _params())
            error, seconds = None, None
        except Exception as e:  # noqa: BLE001 - the claim is what it raises
            error, seconds = e, time.perf_counter() - t0
    finally:
        llm.shutdown()
    return {"error": error, "seconds": seconds, "left": _workers()}


def killed_says() -> str:
    e = killed()["error"]
    text = re.sub(r"pid \d+", "pid N", str(e)).split("): ")[0] + ")"
    return f"{type(e).__name__}: {text}"


def left_behind() -> str:
    from nanoserve import LLM

    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2) as llm:
        llm.generate(PROMPTS[:1], _params(4))
        during = _workers()
    return f"{during} while serving; {_workers()} after shutdown; {killed()['left']} after the " \
           f"killed one's"


CLAIMS = [
    exact("-tp 2, nanoserve-tiny float32, 8 prompts x 32 tokens, 4 rows: what rank 0 sent",
          per_forward),
    exact("journal records in those messages, by kind", journal_kinds),
    exact("the frozen encoder and journal replay against the package, message by message",
          frozen_agrees),
    exact("broadcast bytes over the run, against the messages' own sizes", logits_to_workers),
    exact("-tp 2 against -tp 1 with 12 KV blocks, 4 rows, graphs, prefix caching, a 16-token "
          "budget; 8 prompts behind a shared 2-sentence prefix", hard),
    exact("a worker killed before a step: what generate raises", killed_says),
    timed("a worker killed before a step: seconds until generate raises",
          lambda: killed()["seconds"], fmt="{:.2f} s".format),
    exact("worker processes alive", left_behind),
]
