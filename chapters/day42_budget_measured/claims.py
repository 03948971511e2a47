"""Day 42's numbers: what the token budget buys, measured over HTTP with ``bench serve``.

Five arms, each its own ``nanoserve serve`` on 127.0.0.1 (nanoserve-tiny, float32, 8 slots,
block_size 16; ``arms.py``): chunked prefill off (whole prompts, ``--no-enable-chunked-prefill``),
and chunked prefill at the default budget of 512 tokens and at 256, 128 and 64
(``--max-num-batched-tokens``). One workload (``WORKLOAD``, the ``long_among_short`` dataset):
24 requests, every 4th a 768-id prompt asking for 8 tokens, the rest 16-id prompts streaming 64
tokens, greedy, EOS ignored, seed 0.

- The counts (``counted``) come from one round at rate inf: they do not depend on the clock.
- The times (``timed_rounds``) come from three interleaved rounds, each sending the workload to
  every arm at rate 8 (Poisson, seed 0), then at rate inf. Each timed row is a ratio between two
  arms within a round, and the row reads the median of the three rounds' ratios.
- How the scheduler cuts the long prompt (``steps``) is computed on the live ``Scheduler`` with
  no model: seven short requests decoding, then the long prompt arrives.
"""

from __future__ import annotations

import functools
import math
import statistics

from chapters.runner import exact, timed

from .arms import RUN_LIMIT_S, measure
from .snapshot.workload import long_among_short

ARMS = {
    "off": ("--no-enable-chunked-prefill",),
    "512": ("--max-num-batched-tokens", "512"),  # the offline default (LLM), named: the
    # server's own default is what this chapter decides
    "256": ("--max-num-batched-tokens", "256"),
    "128": ("--max-num-batched-tokens", "128"),
    "64": ("--max-num-batched-tokens", "64"),
}
LONG = dict(long_len=768, long_every=4, long_output_len=8)
WORKLOAD = dict(requests=24, input_len=16, output_len=64, seed=0)
RATE = 8.0  # requests per second, Poisson: the long prompts arrive while streams are running
VOCAB = 2048  # nanoserve-tiny's
ROUNDS = 3


def _bench(rates):
    def run(arm: str, url: str, r: int) -> list[dict]:
        from nanoserve.bench.serve import run_bench

        return run_bench(url, rates, dataset_name="long_among_short",
                         dataset_options=LONG, max_duration_s=RUN_LIMIT_S, **WORKLOAD)
    return run


@functools.cache
def counted() -> dict[str, dict]:
    """One round at rate inf, untimed: what every arm completed."""
    (round0,) = measure(ARMS, 1, _bench([math.inf]))
    return {arm: results[0] for arm, results in round0.items()}


@functools.cache
def timed_rounds() -> list[dict[str, list[dict]]]:
    """Three interleaved rounds: per arm, [rate 8 result, rate inf result]."""
    return measure(ARMS, ROUNDS, _bench([RATE, math.inf]))


def per_arm(key: str) -> str:
    return ", ".join(str(counted()[arm][key]) for arm in ARMS)


def median_ratio(value, a: str, b: str) -> float:
    """The median over the rounds of ``value(arm a) / value(arm b)``, within each round."""
    return statistics.median(value(rnd[a]) / value(rnd[b]) for rnd in timed_rounds())


def p99_itl(results: list[dict]) -> float:
    return results[0]["p99_itl_ms"]


def long_ttft(results: list[dict]) -> float:
    return results[0]["groups"]["long"]["median_ttft_ms"]


def short_ttft(results: list[dict]) -> float:
    return results[0]["groups"]["short"]["median_ttft_ms"]


def saturated_throughput(results: list[dict]) -> float:
    return results[1]["output_throughput"]


# ---------------------------------------------------------------------------- the scheduler


def long_prompt_steps(budget: int | None, chunked: bool) -> list[int]:
    """Prompt tokens of the long prompt in each step of its prefill, beside 7 running decodes,
    on the live Scheduler (no model). ``budget=None`` with ``chunked=False`` is the engine's
    whole-prompt rule: max(512, max_model_len 1024)."""
    from nanoserve.config import EngineConfig
    from nanoserve.engine.kv_manager import KVCacheManager
    from nanoserve.engine.request import Request
    from nanoserve.engine.scheduler import Scheduler

    cfg = EngineConfig(max_num_batched_tokens=budget, enable_chunked_prefill=chunked)
    s = Scheduler(KVCacheManager(512, 16), 8, allocation="incremental",
                  max_num_batched_tokens=cfg.resolve_max_num_batched_tokens(1024),
                  chunked_prefill=chunked)
    reqs = long_among_short(WORKLOAD["requests"], WORKLOAD["input_len"], WORKLOAD["output_len"],
                            vocab_size=VOCAB, seed=WORKLOAD["seed"], **LONG)
    shorts = [r for r in reqs if r.label == "short"]
    long = next(r for r in reqs if r.label == "long")  # the workload's first long prompt
    for i, r in enumerate(shorts[:7]):
        s.add(Request(f"s{i}", r.prompt, r.expected_output_len))

    def step():
        out = s.schedule()
        for r in out.sampled:
            r.append_token(7)
        return out

    while len(s.running) < 7 or not all(r.output_token_ids for r in s.running):
        step()  # the seven short prompts (a budget of 64 takes two steps); then all decode
    big = Request("long", long.prompt, long.expected_output_len)
    s.add(big)
    chunks = []
    while not big.output_token_ids:
        out = step()
        chunks += [c.n for c in out.chunks if c.request is big]
        assert len(out.decode) == 7, "every stream decodes in every step of the long prefill"
    return chunks


@functools.cache
def steps() -> dict[str, list[int]]:
    return {arm: long_prompt_steps(None if arm == "off" else int(arm), arm != "off")
            for arm in ARMS}


def chunk_runs(chunks: list[int]) -> str:
    """[249, 249, 249, 21] -> '249 x 3 + 21': the chunks of one prefill, runs collapsed."""
    runs: list[list[int]] = []
    for c in chunks:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return " + ".join(f"{c} x {k}" if k > 1 else str(c) for c, k in runs)


def _engine_steps(llm, r: int) -> dict:
    """On an in-process engine: seven short requests decoding, then the long prompt. Times each
    decode-only step before it arrives, then each step until its first token."""
    import time

    from nanoserve import SamplingParams

    reqs = long_among_short(WORKLOAD["requests"], WORKLOAD["input_len"], WORKLOAD["output_len"],
                            vocab_size=VOCAB, seed=WORKLOAD["seed"], **LONG)
    shorts = [q for q in reqs if q.label == "short"][:7]
    long = next(q for q in reqs if q.label == "long")
    core = llm.core
    for i, q in enumerate(shorts):
        core.add_request(f"{r}-s{i}", q.prompt, SamplingParams(
            max_tokens=q.expected_output_len, temperature=0, ignore_eos=True))
    while not (core.num_running == 7 and all(x.output_token_ids
                                             for x in core.scheduler.running)):
        core.step()
    decode = []
    for _ in range(5):
        t = time.perf_counter()
        core.step()
        decode.append(time.perf_counter() - t)
    big = core.add_request(f"{r}-long", long.prompt, SamplingParams(
        max_tokens=long.expected_output_len, temperature=0, ignore_eos=True))
    chunk_steps = []
    while not big.output_token_ids:
        t = time.perf_counter()
        core.step()
        chunk_steps.append(time.perf_counter() - t)
    core.run_to_completion()
    return {"decode_s": statistics.median(decode), "chunk_steps_s": chunk_steps,
            "prefill_s": sum(chunk_steps)}


@functools.cache
def engine_steps() -> dict[str, dict]:
    """Each arm's engine in this process (one torch thread), three interleaved rounds after a
    warm-up; each keeps its least disturbed round (the smallest summed prefill)."""
    from chapters.common import SHIPPED, best_of
    from nanoserve import LLM

    engines = {arm: LLM(SHIPPED, dtype="float32", max_num_seqs=8, kernels=False,
                        attention="gathered", enable_chunked_prefill=arm != "off",
                        **({} if arm in ("off", "512") else {"max_num_batched_tokens": int(arm)}))
               for arm in ARMS}
    rounds = iter(range(1000))
    for llm in engines.values():
        _engine_steps(llm, next(rounds))  # warm-up, outside the measurement
    return best_of(3, {arm: (lambda llm=llm: _engine_steps(llm, next(rounds)))
                       for arm, llm in engines.items()}, lambda m: m["prefill_s"])


def longest_step(arm: str) -> float:
    """The longest step a stream sat through while the long prompt went in, on the arm's engine.

    Against chunking off this is measured in process, not over HTTP: off stalls each running
    stream once per long prompt, a chunked arm once per chunk, so at rate 8 the off arm's stalls
    can be fewer than one pooled gap in a hundred and its ITL p99 falls below them (measured on
    a 2-core AVX2-only AMD machine, 2026-12-07; the README's "What a client sees")."""
    return max(engine_steps()[arm]["chunk_steps_s"])


def frozen_matches() -> str:
    """The package's generator against the frozen one, request by request."""
    from nanoserve.bench.workload import long_among_short_requests

    live = long_among_short_requests(WORKLOAD["requests"], WORKLOAD["input_len"],
                                     WORKLOAD["output_len"], vocab_size=VOCAB,
                                     seed=WORKLOAD["seed"], **LONG)
    frozen = long_among_short(WORKLOAD["requests"], WORKLOAD["input_len"],
                              WORKLOAD["output_len"], vocab_size=VOCAB, seed=WORKLOAD["seed"],
                              **LONG)
    same = sum((a.prompt, a.prompt_len, a.expected_output_len, a.label)
               == (b.prompt, b.prompt_len, b.expected_output_len, b.label)
               for a, b in zip(live, frozen, strict=True))
    return f"{same} of {len(frozen)}"


def workload_counts() -> str:
    reqs = long_among_short(WORKLOAD["requests"], WORKLOAD["input_len"], WORKLOAD["output_len"],
                            vocab_size=VOCAB, seed=WORKLOAD["seed"], **LONG)
    longs = [r for r in reqs if r.label == "long"]
    return (f"{len(longs)} of {len(reqs)}; {sum(r.prompt_len for r in reqs):,} prompt tokens, "
            f"{sum(r.expected_output_len for r in reqs):,} out")


def defaults() -> str:
    """The budget each entrypoint runs with when none is named (``EngineConfig``)."""
    from nanoserve.config import EngineConfig

    serve = EngineConfig().for_serving().resolve_max_num_batched_tokens(1024)
    offline = EngineConfig().resolve_max_num_batched_tokens(1024)
    return f"{serve}, {offline}"


RATIO = "{:.2f}x".format

CLAIMS = [
    exact("long prompts in the workload; prompt and output tokens", workload_counts),
    exact("requests, the package's generator identical to the frozen one", frozen_matches),
    exact("long prompt's prefill steps beside 7 decodes: off, 512, 256, 128, 64",
          lambda: ", ".join(str(len(steps()[a])) for a in ARMS)),
    exact("largest prompt chunk in one step: off, 512, 256, 128, 64",
          lambda: ", ".join(str(max(steps()[a])) for a in ARMS)),
    exact("the long prompt's chunks, step by step: off; 512; 256; 128; 64",
          lambda: "; ".join(chunk_runs(steps()[a]) for a in ARMS)),
    exact("default budget, chunked prefill on: nanoserve serve, LLM", defaults),
    exact("requests completed over HTTP: off, 512, 256, 128, 64", lambda: per_arm("completed")),
    exact("requests failed, same five arms", lambda: per_arm("failed")),
    exact("output tokens (final usage chunk), same five arms",
          lambda: per_arm("total_output_tokens")),
    exact("preemptions on the servers, same five arms",
          lambda: ", ".join(str(counted()[a]["server_counters"]["num_preemptions"])
                            for a in ARMS)),
    timed("engine step carrying the whole 768-token prompt, chunking off / the step carrying "
          "the 505-token chunk, budget 512", lambda: longest_step("off") / longest_step("512"),
          fmt=RATIO),
    timed("engine step carrying the whole 768-token prompt, chunking off / the longest step of "
          "budget 256", lambda: longest_step("off") / longest_step("256"), fmt=RATIO),
    timed("ITL p99, budget 512 / budget 128", lambda: median_ratio(p99_itl, "512", "128"),
          fmt=RATIO),
    timed("ITL p99, budget 512 / budget 64", lambda: median_ratio(p99_itl, "512", "64"),
          fmt=RATIO),
    timed("long prompts' median TTFT, budget 64 / budget 512",
          lambda: median_ratio(long_ttft, "64", "512"), fmt=RATIO),
    timed("long prompts' median TTFT, budget 128 / budget 512",
          lambda: median_ratio(long_ttft, "128", "512"), fmt=RATIO),
    timed("short prompts' median TTFT, budget 64 / budget 512",
          lambda: median_ratio(short_ttft, "64", "512"), fmt=RATIO),
    timed("output throughput at rate inf, budget 64 / budget 512",
          lambda: median_ratio(saturated_throughput, "64", "512"), fmt=RATIO),
    timed("engine step carrying the 505-token chunk / a decode-only step, budget 512",
          lambda: engine_steps()["512"]["chunk_steps_s"][0] / engine_steps()["512"]["decode_s"],
          fmt=RATIO),
    timed("engine step carrying a 57-token chunk / a decode-only step, budget 64",
          lambda: statistics.median(engine_steps()["64"]["chunk_steps_s"][:-1])
          / engine_steps()["64"]["decode_s"], fmt=RATIO),
    timed("long prompt's prefill, its steps summed, budget 64 / budget 512",
          lambda: engine_steps()["64"]["prefill_s"] / engine_steps()["512"]["prefill_s"],
          fmt=RATIO),
]
