"""Day 43's numbers: prefix caching on the shipped nanoserve-tiny (float32, greedy), counted.

Every exact claim is a count read from the live package (``LLM.stats``, the scheduler's and the
pool's counters) or from the frozen snapshot; the three timed ones are ratios of two arms timed
in one run, interleaved (``best_of``), on one torch thread. The workloads:

- ``burst``: 8 requests, a 480-token "system prompt" plus a 16-token question each (seeded
  random ids), one ``generate`` call, ``max_tokens=1``: the prefill is the whole bill.
- ``shared_burst``: 6 requests of 56 tokens sharing their first 48, block_size 16, added
  together and stepped once, then drained with 9 tokens each.
- ``mixed``: 16 requests, most behind one of two shared heads (64 and 37 tokens), added one per
  step into a 40-block pool of block_size 4 under a 32-token budget, so chunked prefill, hits,
  preemption and resumes all happen; two are aborted once they hold 3 and 1 tokens.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import time

import torch

from chapters.common import ROOT, SHIPPED, best_of, one_thread
from chapters.runner import bound, exact, timed

from .snapshot import prefix_cache as snapshot_cache

SYSTEM_LEN, QUESTION_LEN, BURST = 480, 16, 8
MIXED = dict(dtype="float32", block_size=4, num_kv_blocks=40, max_num_seqs=6,
             max_num_batched_tokens=32)
MIXED_ABORTS = {"r5": 3, "r10": 1}  # request -> aborted once it holds this many tokens


def ids(seed: int, n: int, bos: bool = True) -> list[int]:
    """``n`` seeded random token ids of the shipped model's vocabulary (no EOS), BOS first."""
    rng = random.Random(seed)
    head = [0] if bos else []
    return head + [rng.randrange(2, 2048) for _ in range(n - len(head))]


def measured(fn):
    """Cached, on one torch thread: the counts do not depend on threads, and a small shared
    CPU runs one thread with less noise."""
    @functools.cache
    @functools.wraps(fn)
    def run(*args):
        with one_thread(), torch.inference_mode():
            return fn(*args)
    return run


def greedy(max_tokens: int, **kw):
    from nanoserve import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def llm(caching: bool, **kw):
    from nanoserve import LLM

    return LLM(SHIPPED, **{"dtype": "float32", "enable_prefix_caching": caching, **kw})


# ---------------------------------------------------------------- a shared system prompt


def burst_prompts(seed: int) -> list[list[int]]:
    system = ids(seed, SYSTEM_LEN)
    return [system + ids(seed * 100 + i, QUESTION_LEN, bos=False) for i in range(BURST)]


@measured
def burst(caching: bool) -> dict:
    lm = llm(caching)
    lm.generate(burst_prompts(1), greedy(1))
    s = lm.stats
    return {"computed": s.tokens_computed, "queries": s.prefix_cache_queries,
            "hits": s.prefix_cache_hits, "prompt": s.prompt_tokens}


def burst_speedup(rounds: int = 5) -> float:
    """Wall time of the burst, off / on. Each round both arms get a new system prompt, so the
    caching arm starts every round cold and only the burst's own sharing counts."""
    arms = {c: llm(c) for c in (False, True)}
    n = [0]

    def arm(caching: bool):
        def once() -> float:
            if not caching:  # the first arm of a round starts the round
                n[0] += 1
            prompts = burst_prompts(10 + n[0])
            t = time.perf_counter()
            arms[caching].generate(prompts, greedy(1))
            return time.perf_counter() - t
        return once

    with torch.inference_mode():
        best = best_of(rounds, {"off": arm(False), "on": arm(True)}, lambda s: s)
    return best["off"] / best["on"]


def _one_request(lm, prompt) -> float:
    t = time.perf_counter()
    lm.generate([prompt], greedy(1))
    return time.perf_counter() - t


def miss_overhead(rounds: int = 5) -> float:
    """One 496-token request that hits nothing, caching on / caching off. Both arms get the
    same new prompt in a round; the caching arm hashes, registers and, once its pool is full
    of cached blocks, evicts."""
    on, off = llm(True), llm(False)
    n = [0]

    def arm(lm, first: bool):
        def once() -> float:
            if first:
                n[0] += 1
            return _one_request(lm, ids(1000 + n[0], SYSTEM_LEN + QUESTION_LEN))
        return once

    with torch.inference_mode():
        best = best_of(rounds, {"on": arm(on, True), "off": arm(off, False)}, lambda s: s)
    return best["on"] / best["off"]


def first_hit_speedup(rounds: int = 5) -> float:
    """Caching on, one engine: a 496-token request whose 480-token system prompt another
    request has just computed (the first hit), against one whose system prompt is new."""
    lm = llm(True)
    n = [0]

    def hit() -> float:
        n[0] += 1
        system = ids(5000 + n[0], SYSTEM_LEN)
        _one_request(lm, system + ids(1, QUESTION_LEN, bos=False))  # untimed: it fills the cache
        return _one_request(lm, system + ids(2, QUESTION_LEN, bos=False))

    def miss() -> float:
        n[0] += 1
        return _one_request(lm, ids(9000 + n[0], SYSTEM_LEN) + ids(2, QUESTION_LEN, bos=False))

    with torch.inference_mode():
        best = best_of(rounds, {"hit": hit, "miss": miss}, lambda s: s)
    return best["miss"] / best["hit"]


# ---------------------------------------------------------------- what a miss and a repeat cost


@measured
def hash_calls() -> str:
    """hash_block calls for one cold request: 200 prompt tokens, 100 generated, block_size 16.
    Its forwards compute 299 tokens (the last sampled one is never fed back): 18 full blocks."""
    import nanoserve.engine.prefix_cache as live

    calls, real = [0], live.hash_block

    def counting(parent, tokens):
        calls[0] += 1
        return real(parent, tokens)

    lm = llm(True)
    live.hash_block = counting
    try:
        lm.generate([ids(77, 200)], greedy(100))
    finally:
        live.hash_block = real
    full = (200 + 100 - 1) // 16
    return f"{calls[0]}, one per full block" if calls[0] == full else \
        f"{calls[0]} for {full} full blocks"


@measured
def repeat_cost(n: int) -> int:
    """Tokens computed by the second of two identical ``n``-token prompts, max_tokens 1."""
    lm = llm(True)
    prompt = ids(n, n)
    lm.generate([prompt], greedy(1))
    before = lm.stats.tokens_computed
    lm.generate([prompt], greedy(1))
    return lm.stats.tokens_computed - before


# ---------------------------------------------------------------- requests admitted together


def shared_prompts() -> list[list[int]]:
    head = ids(48, 48)
    return [head + ids(4800 + i, 8, bos=False) for i in range(6)]


@measured
def shared_burst(caching: bool) -> dict:
    """Six requests added together; one step; the pool read; then the drain."""
    lm = llm(caching)
    core, pool = lm.core, lm.core.scheduler.kv_cache_manager
    reqs = [core.add_request(f"s{i}", p, greedy(9)) for i, p in enumerate(shared_prompts())]
    core.step()
    held = pool.num_held
    shared = [b for b in reqs[0].blocks if all(b in r.blocks for r in reqs)]
    holders = {sum(b in r.blocks for r in reqs) for b in shared}
    first = {"admitted": core.scheduler.admitted_total, "hits": core.scheduler.prefix_cache_hits,
             "held": held, "shared": len(shared), "holders": holders}
    while core.has_unfinished():
        core.step()
    core.check_drained()
    first.update(free=pool.num_free, blocks=pool.num_blocks,
                 cached=getattr(pool, "num_cached", 0))
    return first


def held_off_on() -> str:
    on = shared_burst(True)
    holders = on["holders"].pop() if len(on["holders"]) == 1 else on["holders"]
    return (f"{shared_burst(False)['held']} vs {on['held']} ({on['shared']} shared, "
            f"{holders} holders each)")


# ---------------------------------------------------------------- the mixed workload


def mixed_workload(n: int = 16, seed: int = 43) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): every fifth request has no shared head, the others alternate
    between a 64-token and a 37-token head, each then a 3-20-token question of its own."""
    rng = random.Random(seed)
    heads = [ids(1, 64), ids(2, 37)]
    out = []
    for i in range(n):
        head = heads[i % 2] if i % 5 else [0]
        question = [rng.randrange(2, 2048) for _ in range(rng.randint(3, 20))]
        out.append((head + question, rng.randint(6, 24)))
    return out


@measured
def mixed(caching: bool) -> dict:
    """Request i is added before step i; an aborted request goes once it holds its count of
    tokens, so both arms abort it at the same point of its own life."""
    lm = llm(caching, **{k: v for k, v in MIXED.items() if k != "dtype"})
    core, work = lm.core, mixed_workload()
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    live: dict = {}
    i = 0
    while i < len(work) or core.has_unfinished():
        if i < len(work):
            prompt, m = work[i]
            live[f"r{i}"] = core.add_request(f"r{i}", prompt, greedy(m, logprobs=0))
            i += 1
        for rid, k in MIXED_ABORTS.items():
            r = live.get(rid)
            if r is not None and not r.is_finished and len(r.output_token_ids) >= k:
                core.abort_request(rid)
        for d in core.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            logprobs.setdefault(d.request_id, []).extend(e.logprob for e in d.new_logprobs)
    core.check_drained()
    s, pool = core.scheduler, core.scheduler.kv_cache_manager
    return {"tokens": tokens, "logprobs": logprobs, "preemptions": s.preemptions,
            "recomputed": s.recomputed_tokens, "aborted": core.counters.by_reason.get("abort"),
            "free": pool.num_free, "blocks": pool.num_blocks,
            "cached": getattr(pool, "num_cached", 0), "usage": core.snapshot().kv_cache_usage}


def mixed_differ() -> str:
    a, b = mixed(True)["tokens"], mixed(False)["tokens"]
    names = set(a) | set(b)
    return f"{sum(a.get(k) != b.get(k) for k in names)} of {len(names)}"


def mixed_logprob_gap() -> float:
    a, b = mixed(True)["logprobs"], mixed(False)["logprobs"]
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


# ---------------------------------------------------------------- the pool by hand


def eviction_order(module=None) -> str:
    """Six blocks of two tokens. A (3 blocks) and B (1) are computed, registered and freed; C
    hits A's first two blocks, adds one of its own, and is freed; then D asks for four."""
    m = module or _live()
    pool = m.CachingBlockAllocator(num_blocks=6, block_size=2)

    def run(tokens, hit=()):
        hashes = m.block_hashes(tokens, 2)
        pool.take(list(hit))
        blocks = list(hit) + pool.allocate(len(hashes) - len(hit))
        pool.register(blocks, hashes, tokens)
        pool.free(blocks)

    a = [1, 2, 3, 4, 5, 6]
    run(a)
    run([7, 8])
    c = [1, 2, 3, 4, 9, 9]
    run(c, pool.match(m.block_hashes(c, 2)[:2], c))
    got = pool.allocate(4)
    found = pool.match(m.block_hashes(a, 2), a)
    pool.check_invariants()
    return f"{', '.join(map(str, got))}; finds {', '.join(map(str, found))}"


def _live():
    import nanoserve.engine.prefix_cache as live

    return live


HASH_CODE = ("import sys; sys.path.insert(0, {root!r}); "
             "from nanoserve.engine.prefix_cache import block_hashes; "
             "ids = {ids!r}; print([h.hex() for h in block_hashes(ids, 16)], hash(str(ids)))")


@functools.cache
def other_processes() -> str:
    """block_hashes of a 200-token prompt here and in two fresh interpreters whose
    PYTHONHASHSEED differs; Python's own hash() of the same ids as text, for contrast."""
    prompt = ids(200, 200)
    here = [h.hex() for h in _live().block_hashes(prompt, 16)]
    runs = []
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", HASH_CODE.format(root=str(ROOT), ids=prompt)],
                             capture_output=True, text=True, timeout=120, check=True,
                             env=os.environ | {"PYTHONHASHSEED": seed}).stdout.strip()
        hexes, salted = out.rsplit(" ", 1)
        runs.append((eval(hexes), salted))  # noqa: S307 - our own child's list of hex strings
    equal = sum(here[i] == runs[0][0][i] == runs[1][0][i] for i in range(len(here)))
    salted = "differs" if runs[0][1] != runs[1][1] else "does not"
    return f"{equal} of {len(here)} equal, while Python's hash() of its text {salted}"


# ---------------------------------------------------------------- package against snapshot


def random_ops(module, seed: int = 43, n: int = 3000, num_blocks: int = 12,
               block_size: int = 2) -> list[tuple]:
    """A seeded random run of the pool's whole interface: admit a sequence (match, take,
    allocate, register), free one, forget one, and calls it must refuse (an allocation too big,
    a foreign id, a block named twice in one free). Prompts share three heads, so hits, sharing
    and eviction all happen. Returns what every call returned and the pool's counts after it;
    ``check_invariants`` runs after each."""
    rng = random.Random(seed)
    pool = module.CachingBlockAllocator(num_blocks, block_size)
    heads = [[rng.randrange(50) for _ in range(rng.randint(2, 7))] for _ in range(3)]
    held: list[list[int]] = []
    log = []
    for _ in range(n):
        op = rng.random()
        if op < 0.5:
            tokens = rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randint(1, 6))]
            hashes = module.block_hashes(tokens, block_size)
            hit = pool.match(hashes[:(len(tokens) - 1) // block_size], tokens)
            need = -(-len(tokens) // block_size) - len(hit)
            if pool.can_allocate(need + pool.free_cost(hit)):
                pool.take(hit)
                blocks = hit + pool.allocate(need)
                pool.register(blocks[:len(hashes)], hashes, tokens)
                held.append(blocks)
                result = ("admit", tuple(hit), tuple(blocks))
            else:
                result = ("wait", tuple(hit), need)
        elif op < 0.85 and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free(blocks)
            result = ("free", tuple(blocks))
        elif op < 0.9 and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.forget(blocks)
            pool.free(blocks)
            result = ("forget", tuple(blocks))
        else:  # calls the pool must refuse, changing nothing
            bad = rng.choice([lambda: pool.allocate(num_blocks + 1),
                              lambda: pool.free([num_blocks]),
                              lambda: pool.free(held[0] + held[0][:1]) if held else
                              pool.free([0, 0])])
            try:
                bad()
                result = ("accepted",)
            except ValueError as e:
                result = ("refused", str(e))
        pool.check_invariants()
        log.append((result, pool.num_free, pool.num_held, pool.num_cached, pool.evictions))
    return log


@functools.cache
def package_vs_snapshot(n: int = 3000) -> str:
    a, b = random_ops(_live(), n=n), random_ops(snapshot_cache, n=n)
    return f"{sum(x != y for x, y in zip(a, b, strict=True)):,} of {n:,}"


SHIP = "nanoserve-tiny float32"
BURST_LABEL = (f"{SHIP}, a burst of 8 (480-token system prompt + 16-token question each, "
               "max_tokens 1)")
CLAIMS = [
    exact(f"{BURST_LABEL}: tokens computed, caching off vs on",
          lambda: f"{burst(False)['computed']:,} vs {burst(True)['computed']:,}"),
    exact("the same burst: prompt tokens found cached, of those looked up",
          lambda: f"{burst(True)['hits']:,} of {burst(True)['queries']:,}"),
    timed(f"2-core x86 CPU, no GPU, one thread; {SHIP}: that burst's wall time, off / on "
          "(best of 5 interleaved rounds)", burst_speedup, fmt="{:.2f}x".format),
    timed("a request that hits nothing (496 new tokens): wall time, caching on / off (best of "
          "5 interleaved rounds)", miss_overhead, fmt="{:.2f}x".format),
    timed("the first hit (480 of its 496 tokens cached just before) against a miss, caching "
          "on: miss / hit (best of 5 interleaved rounds)", first_hit_speedup,
          fmt="{:.2f}x".format),
    exact("hash_block calls for one request of 200 prompt and 100 generated tokens "
          "(block_size 16)", hash_calls),
    exact("a repeat of an identical prompt (block_size 16): tokens computed for 48 and for "
          "49 prompt tokens", lambda: f"{repeat_cost(48)} and {repeat_cost(49)}"),
    exact("a burst of 6 (56-token prompts sharing their first 48, block_size 16) stepped "
          "once: admitted, tokens hit",
          lambda: "{admitted} admitted, {hits} hit".format(**shared_burst(True))),
    exact("blocks held after that step, caching off vs on", held_off_on),
    exact("after its drain (9 tokens each), caching on: blocks free of total; cached",
          lambda: "{free} of {blocks} free; {cached} cached".format(**shared_burst(True))),
    exact("mixed workload (16 requests, 2 shared heads, 40-block pool, 32-token budget, 2 "
          "aborted): requests whose tokens differ, caching on vs off", mixed_differ),
    exact("mixed workload: preemptions and tokens recomputed on resume, caching off vs on",
          lambda: "{} and {:,} vs {} and {:,}".format(
              mixed(False)["preemptions"], mixed(False)["recomputed"],
              mixed(True)["preemptions"], mixed(True)["recomputed"])),
    exact("mixed workload, caching on, after the drain: blocks free of total, cached, KV usage",
          lambda: "{free} of {blocks} free, {cached} cached, usage {usage:.0%}".format(
              **mixed(True))),
    bound("mixed workload: largest difference of a chosen token's logprob, caching on vs off",
          mixed_logprob_gap, fmt="{:.1e}".format),
    exact("hand-made pool (6 blocks of 2 tokens): what allocate(4) returns after A, B and C "
          "have come and gone; A's prefix then", eviction_order),
    exact("hashes of a 200-token prompt's 12 full blocks, here and in two more processes "
          "(PYTHONHASHSEED 1 and 2)", other_processes),
    exact("package vs Day 43 snapshot, 3,000 seeded random pool operations: observations "
          "that differ", package_vs_snapshot),
]
