"""Day 49's numbers: the buckets, what the compiler sees of a decode step, how often it compiles,
that greedy tokens do not move, and what compiling buys on this CPU.

Model rows run nanoserve-tiny in float32 on one torch thread. The package rows use
``LLM(compile=True)`` (inductor, C++ built by g++); the snapshot rows drive the frozen
``CompiledDecode`` over Day 17's cache with the Day 1 model. Graph-shape rows use a counting
backend registered with dynamo, which keeps the graph it is handed and runs it eagerly.
"""

from __future__ import annotations

import functools
import os
import time

import torch

from chapters.common import SHIPPED, best_of, one_thread
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
from chapters.day28_batched_decode.snapshot.decode import batched_decode
from chapters.runner import exact, timed

from .snapshot import compiled as snap

PROMPTS = [[0, 5 + i, 9, 11] for i in range(8)]
GEN = (4, 8, 16, 32)
KW = dict(dtype="float32", max_num_seqs=4, max_model_len=64, skip_tokenizer_init=True,
          enable_chunked_prefill=False,  # Day 49 counts decode steps of whole-prompt runs
          prepack=False)  # and aten::mm calls: float32 through F.linear, as on the day
SNAP_ROWS, SNAP_STEPS = 4, 12
GRAPHS: list = []  # what the counting backend was handed, newest last


@torch._dynamo.register_backend
def day49_count(gm, example_inputs):
    """Keep the graph dynamo hands over, run it as it is."""
    GRAPHS.append(gm)
    return gm.forward


def _params():
    from nanoserve import SamplingParams

    return [SamplingParams(temperature=0, max_tokens=GEN[i % len(GEN)], ignore_eos=True)
            for i in range(len(PROMPTS))]


# ---------------------------------------------------------------------------- buckets, flags


def buckets() -> str:
    return "; ".join(str(snap.decode_buckets(n)) for n in (4, 8, 12, 32))


def buckets_agree() -> str:
    from nanoserve.cuda.compiled import decode_buckets

    agree = sum(decode_buckets(n) == snap.decode_buckets(n) for n in range(1, 65))
    return f"{agree} of 64 agree"


def defaults() -> str:
    import argparse

    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai.serve import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    serve = "--compile" if p.parse_args([]).compile else "--no-compile"
    return f"compile={EngineConfig.default('compile')}; {serve}"


def refusal() -> str:
    from nanoserve import LLM

    path = os.environ.get("PATH", "")
    os.environ["PATH"] = ""  # no g++ to be found
    try:
        LLM(SHIPPED, compile=True, **KW)
    except RuntimeError as e:
        return f"RuntimeError at construction: {str(e).split(':')[0]}"
    finally:
        os.environ["PATH"] = path
    return "nothing raised"


# ---------------------------------------------------------------------------- the snapshot


def _snap_setup(cache_cls=BatchedPagedKVCache):
    model = load_model(SHIPPED)
    pool = BlockAllocator(128, 4)
    cache = cache_cls.for_model(model, 128, 4, SNAP_ROWS, 64)
    rows = list(range(SNAP_ROWS))
    for r in rows:
        cache.tables[r].extend(pool.allocate(8))
    prompts = [[0, 5 + r, 9, 11][: 2 + r] for r in rows]  # ragged: 2, 3, 4, 4 tokens
    logits = padded_prefill(model, cache, rows, prompts)
    return model, cache, rows, logits.argmax(-1).tolist()


def _snap_run(step) -> list[list[int]]:
    """SNAP_STEPS greedy decode steps of SNAP_ROWS rows through ``step(model, cache, rows,
    toks)``; the tokens of every step."""
    model, cache, rows, toks = _snap_setup()
    out = []
    with torch.inference_mode():
        for _ in range(SNAP_STEPS):
            toks = step(model, cache, rows, toks).argmax(-1).tolist()
            out.append(toks)
    return out


@functools.cache
def opaque() -> tuple[int, int]:
    """The frozen CompiledDecode with the counting backend: graphs built over 12 steps at batch
    4, and custom-op calls in the graph."""
    torch._dynamo.reset()
    GRAPHS.clear()
    holder = {}

    def step(model, cache, rows, toks):
        if "c" not in holder:
            holder["c"] = snap.CompiledDecode(model, SNAP_ROWS, backend="day49_count")
        return snap.compiled_decode(holder["c"], cache, rows, toks)

    _snap_run(step)
    op = torch.ops.day49.paged_attend
    ops = sum(n.target in (op, op.default) for n in GRAPHS[-1].graph.nodes)
    return holder["c"].compiles, ops


def graph() -> str:
    compiles, ops = opaque()
    return f"{compiles} graph; {ops} `paged_attend` calls"


def traced() -> str:
    """The same 12 steps with Day 17's cache handed to the traced forward as it is: the read,
    its shapes and its boolean-mask writes inside dynamo's view (graph breaks allowed)."""
    torch._dynamo.reset()
    GRAPHS.clear()
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 1000
    fns, counts = {}, []

    def step(model, cache, rows, toks):
        if "f" not in fns:
            def forward(ids, pos):
                return model.compute_logits(model(ids, pos, cache)[:, -1])

            fns["f"] = torch.compile(forward, backend="day49_count", dynamic=False)
        fn = fns["f"]
        ids = torch.tensor(toks)[:, None]
        pos = torch.tensor([[cache.lengths[r]] for r in rows])
        cache.begin_step(rows, [1] * len(rows))
        try:
            return fn(ids, pos)
        finally:
            cache.end_step()
            counts.append(len(GRAPHS))

    try:
        _snap_run(step)
        later = {b - a for a, b in zip(counts, counts[1:], strict=False)}
        each = later.pop() if len(later) == 1 else sorted(later)
        return f"{counts[-1]} ({counts[0]} for the first step, then {each} a step)"
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()
        GRAPHS.clear()


def snapshot_tokens() -> str:
    """Inductor through the frozen CompiledDecode against Day 28's eager step, token by token."""
    torch._dynamo.reset()
    holder = {}

    def compiled(model, cache, rows, toks):
        if "c" not in holder:
            holder["c"] = snap.CompiledDecode(model, SNAP_ROWS)
        return snap.compiled_decode(holder["c"], cache, rows, toks)

    with one_thread():
        a = _snap_run(compiled)
        b = _snap_run(lambda model, cache, rows, toks: batched_decode(model, cache, rows, toks))
    same = sum(x == y for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True))
    return f"{same} of {SNAP_ROWS * SNAP_STEPS} tokens agree"


# ---------------------------------------------------------------------------- the package


@functools.cache
def package_run() -> dict:
    """8 greedy requests (lengths 4/8/16/32) over 4 slots, compiled with inductor, run twice;
    then the same requests eager."""
    from nanoserve import LLM

    torch._dynamo.reset()
    with one_thread():
        llm = LLM(SHIPPED, compile=True, **KW)
        c = llm.engine.compiled
        met, compiling_calls, bucket, fn = set(), [0], c.bucket, c.fn
        c.bucket = lambda B: met.add(bucket(B)) or bucket(B)

        def counted(*args):
            before = c.compiles
            out = fn(*args)
            compiling_calls[0] += c.compiles > before
            return out

        c.fn = counted
        tokens = [o.token_ids for o in llm.generate(PROMPTS, _params())]
        first = dict(compiles=c.compiles, calls=c.calls, compiling=compiling_calls[0],
                     decode_steps=llm.stats.decode_steps, forwards=llm.stats.forward_passes,
                     met=sorted(met), warmup_s=c.warmup_s)
        again = [o.token_ids for o in llm.generate(PROMPTS, _params())]
        eager = LLM(SHIPPED, **KW)
        want = [o.token_ids for o in eager.generate(PROMPTS, _params())]
        mm = {name: _mm_per_step(x) for name, x in (("compiled", llm), ("eager", eager))}
    return dict(first, added=c.compiles - first["compiles"], tokens=tokens, again=again,
                want=want, mm=mm)


def _mm_per_step(llm, steps: int = 4) -> float:
    """aten::mm calls per decode step, counted by the profiler over decode-only steps."""
    from torch.profiler import ProfilerActivity, profile

    from nanoserve import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for i in range(4):
        llm.core.add(llm.core.make_request(f"mm{i}", PROMPTS[i], params))
    with torch.inference_mode():
        llm.core.step()  # the prefill
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                llm.core.step()
        while llm.core.has_unfinished():
            llm.core.step()
    calls = sum(e.count for e in prof.key_averages() if e.key == "aten::mm")
    return calls / steps


class _quiet_stderr:
    """The profiler's native start/stop lines go to fd 2; keep them out of the claims table."""

    def __enter__(self):
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)


def met_and_compiles() -> str:
    r = package_run()
    return f"buckets {', '.join(map(str, r['met']))}; {r['compiles']} compilations"


def through_compiled() -> str:
    r = package_run()
    prefills = r["forwards"] - r["decode_steps"]
    return (f"{r['calls']} of {r['decode_steps']} decode steps; "
            f"{r['calls'] - r['decode_steps']} of {prefills} prefills")


def package_tokens() -> str:
    r = package_run()
    bad = sum(a != b for a, b in zip(r["tokens"], r["want"], strict=True))
    bad_again = sum(a != b for a, b in zip(r["again"], r["want"], strict=True))
    return f"{bad} of {len(r['want'])} requests differ (warm run: {bad_again})"


def mm_calls() -> str:
    mm = package_run()["mm"]
    return f"{mm['eager']:g} and {mm['compiled']:g}"


# ---------------------------------------------------------------------------- timed

TIMED_ROWS, TIMED_STEPS = 8, 32


@torch.inference_mode()
def speed_ratio(rounds: int = 3) -> float:
    """Eager step time over compiled step time: 8 rows, 32 decode steps per round, the two LLMs
    stepped in interleaved rounds (best_of); each compiled bucket was built before timing."""
    from nanoserve import LLM, SamplingParams

    torch._dynamo.reset()
    kw = dict(KW, max_num_seqs=TIMED_ROWS, max_model_len=128)
    llms = {"compiled": LLM(SHIPPED, compile=True, **kw), "eager": LLM(SHIPPED, **kw)}
    params = SamplingParams(temperature=0, max_tokens=TIMED_STEPS + 2, ignore_eos=True)
    ids = iter(range(10**6))

    def arm(llm):
        def once() -> float:
            for i in range(TIMED_ROWS):
                prompt = [0, 5 + i, 9, 11, 13, 17, 19, 23]
                llm.core.add(llm.core.make_request(f"t{next(ids)}", prompt, params))
            llm.core.step()  # the prefill
            llm.core.step()  # the first decode step: the compile lands here, untimed
            t0 = time.perf_counter()
            for _ in range(TIMED_STEPS):
                llm.core.step()
            return time.perf_counter() - t0
        return once

    arm(llms["compiled"])()  # warm-up, kept out of every timed round
    best = best_of(rounds, {k: arm(v) for k, v in llms.items()}, lambda s: s)
    return best["eager"] / best["compiled"]


CLAIMS = [
    exact("`decode_buckets(max_num_seqs)` for 4, 8, 12, 32", buckets),
    exact("the package's `decode_buckets` against the snapshot's, max_num_seqs 1 to 64",
          buckets_agree),
    exact("defaults: `LLM(compile=...)`, `nanoserve serve`", defaults),
    exact("`LLM(compile=True)` with no C++ compiler on PATH", refusal),
    exact("the graph dynamo hands the backend over 12 decode steps at batch 4 (snapshot, "
          "nanoserve-tiny, 4 layers)", graph),
    exact("compilations over the same 12 steps with Day 17's read traced into the graph",
          traced),
    exact("nanoserve-tiny, float32, 8 requests (lengths 4/8/16/32) over 4 slots, inductor: "
          "buckets met, compilations", met_and_compiles),
    exact("compilations added by running the same 8 requests again",
          lambda: package_run()["added"]),
    exact("forwards through the compiled graph in that run", through_compiled),
    exact("decode calls whose wall time is booked to `warmup_s`",
          lambda: f"{package_run()['compiling']} of {package_run()['calls']}"),
    exact("greedy tokens, `compile=True` against eager (nanoserve-tiny, float32, 8 requests)",
          package_tokens),
    exact("greedy tokens, the snapshot's inductor decode against Day 28's eager step (4 rows, "
          "12 steps, float32)", snapshot_tokens),
    exact("`aten::mm` calls per decode step, eager and compiled (nanoserve-tiny, batch 4)",
          mm_calls),
    timed("decode speed, compiled / eager (2-core x86 CPU, no GPU, one thread; nanoserve-tiny, "
          "float32, batch 8, 32 steps, warm-up excluded)", speed_ratio, fmt="{:.2f}x".format),
]
