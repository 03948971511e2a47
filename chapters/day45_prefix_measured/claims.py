"""Day 45's numbers: what prefix caching buys, measured over HTTP with ``bench serve``.

Two arms, each its own ``nanoserve serve`` on 127.0.0.1 (nanoserve-tiny, float32, 8 slots,
block_size 16, a pool of 2048 blocks so that nothing is evicted across rounds; Day 42's
``arms.py``): prefix caching off (the default) and on (``--enable-prefix-caching``). One
workload, vLLM's ``prefix_repetition``: 16 requests, 4 prefixes of 512 ids, each request one of
them plus its own 32-id suffix, 16 tokens out, greedy, EOS ignored.

- The counts (``counted``): one round at rate inf with seed 0, untimed, every request's text
  kept (``detailed``). The prefix cache's queries and hits are the server's own ``/metrics``
  counters, read by ``bench serve`` before and after the rate, so the probe request is outside
  them (its K/V is not: it warms the cache with the first request's prompt, as vLLM's probe
  does).
- The times (``timed_rounds``): three interleaved rounds, each sending the workload at rate 4
  (Poisson) and then at rate inf, every run with a seed of its own (``seeds``: fresh prefixes,
  so no run finds the blocks of an earlier one; nothing is evicted in a pool of 2048 blocks).
  Each row is the median over rounds of a ratio between the two arms within a round.
- The peer (``recorded``): vLLM's CPU build and nanoserve, caching on and off, the same
  workload at block_size 32 (the smallest vLLM's CPU attention takes), written by ``peers.py``
  (``make bench-peers``) into ``results/prefix-peers.json``.
"""

from __future__ import annotations

import functools
import math
import statistics

from chapters.day42_budget_measured.arms import RUN_LIMIT_S, measure
from chapters.runner import exact, recorded, timed

from .snapshot.workload import cached_tokens, prefix_repetition

ARMS = {"off": ("--num-kv-blocks", "2048"),
        "on": ("--num-kv-blocks", "2048", "--enable-prefix-caching")}
PREFIX = dict(prefix_len=512, suffix_len=32, num_prefixes=4, output_len=16)
REQUESTS = 16
BLOCK_SIZE = 16  # the engine's default
VOCAB = 2048  # nanoserve-tiny's
RATE = 4.0
ROUNDS = 3
PEERS = "prefix-peers.json"


def workload(seed: int = 0):
    return prefix_repetition(REQUESTS, vocab_size=VOCAB, seed=seed, **PREFIX)


def seeds(r: int) -> tuple[int, int]:
    """Round ``r``'s seeds for its two rates: fresh prefixes for every run on a server, so a
    run never finds the blocks of an earlier one (``bench serve`` sends the same requests at
    every rate of one call, hence one call per rate)."""
    return 2 * r + 1, 2 * r + 2


def _bench(rates_and_seeds, detailed=False):
    def run(arm: str, url: str, r: int) -> list[dict]:
        from nanoserve.bench.serve import run_bench

        return [run_bench(url, [rate], requests=REQUESTS, seed=seed,
                          dataset_name="prefix_repetition", dataset_options=PREFIX,
                          max_duration_s=RUN_LIMIT_S, detailed=detailed)[0]
                for rate, seed in rates_and_seeds(r)]
    return run


@functools.cache
def counted() -> dict[str, dict]:
    """One run at rate inf with seed 0, every request's text kept."""
    (round0,) = measure(ARMS, 1, _bench(lambda r: [(math.inf, 0)], detailed=True))
    return {arm: results[0] for arm, results in round0.items()}


@functools.cache
def timed_rounds() -> list[dict[str, list[dict]]]:
    """Per round and arm: [rate 4 result, rate inf result], each with its own seed."""
    return measure(ARMS, ROUNDS, _bench(lambda r: list(zip((RATE, math.inf), seeds(r),
                                                           strict=True))))


def counter(arm: str, name: str) -> int:
    return counted()[arm]["server_counters"][name]


def predicted_hits() -> int:
    """The frozen model: the probe's prompt first (the first request's), then the 16 prompts."""
    prompts = [r.prompt for r in workload()]
    return cached_tokens(prompts, BLOCK_SIZE, warm=[prompts[0]])


def computed(arm: str) -> int:
    """Prompt tokens the server computed: looked up minus found with caching, all without."""
    m = counted()[arm]
    if arm == "off":
        assert counter("off", "prefix_cache_queries") == 0, "caching off looked something up"
        return m["total_input_tokens"]
    return counter(arm, "prefix_cache_queries") - counter(arm, "prefix_cache_hits")


def texts_differ() -> str:
    off, on = (counted()[a]["details"]["generated_texts"] for a in ("off", "on"))
    return f"{sum(a != b for a, b in zip(off, on, strict=True))} of {len(off)}"


def frozen_matches() -> str:
    from nanoserve.bench.workload import prefix_repetition_requests

    live = prefix_repetition_requests(REQUESTS, vocab_size=VOCAB, seed=0, **PREFIX)
    same = sum((a.prompt, a.prompt_len, a.expected_output_len)
               == (b.prompt, b.prompt_len, b.expected_output_len)
               for a, b in zip(live, workload(), strict=True))
    return f"{same} of {REQUESTS}"


def workload_counts() -> str:
    reqs = workload()
    prefixes = {tuple(r.prompt[:PREFIX["prefix_len"]]) for r in reqs}
    return (f"{len(prefixes)} prefixes x {REQUESTS // len(prefixes)} requests; "
            f"{sum(r.prompt_len for r in reqs):,} prompt tokens")


def median_ratio(value, a: str, b: str) -> float:
    return statistics.median(value(rnd[a]) / value(rnd[b]) for rnd in timed_rounds())


def both(fn) -> str:
    return ", ".join(str(fn(a)) for a in ARMS)


RATIO = "{:.2f}x".format

CLAIMS = [
    exact("the workload: prefixes, requests per prefix; prompt tokens", workload_counts),
    exact("requests, the package's generator identical to the frozen one", frozen_matches),
    exact("prompt tokens the frozen cache model finds, block_size 16", predicted_hits),
    exact("prompt tokens looked up / found cached, caching on (/metrics)",
          lambda: f"{counter('on', 'prefix_cache_queries')} / "
                  f"{counter('on', 'prefix_cache_hits')}"),
    exact("prompt tokens looked up / found cached, caching off (/metrics)",
          lambda: f"{counter('off', 'prefix_cache_queries')} / "
                  f"{counter('off', 'prefix_cache_hits')}"),
    exact("prompt tokens computed: caching off, on", lambda: both(computed)),
    exact("share of prompt tokens computed with caching on",
          lambda: computed("on") / computed("off"), fmt="{:.1%}".format),
    exact("requests completed: off, on", lambda: both(lambda a: counted()[a]["completed"])),
    exact("requests failed: off, on", lambda: both(lambda a: counted()[a]["failed"])),
    exact("output tokens (final usage chunk): off, on",
          lambda: both(lambda a: counted()[a]["total_output_tokens"])),
    exact("requests whose text differs, caching on vs off", texts_differ),
    exact("evicted blocks, preemptions with caching on",
          lambda: f"{counter('on', 'prefix_cache_evicted_blocks')}, "
                  f"{counter('on', 'num_preemptions')}"),
    timed("median TTFT at rate 4, caching off / on",
          lambda: median_ratio(lambda x: x[0]["median_ttft_ms"], "off", "on"), fmt=RATIO),
    timed("median TTFT at rate inf, caching off / on",
          lambda: median_ratio(lambda x: x[1]["median_ttft_ms"], "off", "on"), fmt=RATIO),
    timed("output throughput at rate inf, caching on / off",
          lambda: median_ratio(lambda x: x[1]["output_throughput"], "on", "off"), fmt=RATIO),
    recorded("prompt tokens found cached at block_size 32: nanoserve, vLLM CPU 0.32", PEERS,
             "hits_block32"),
    recorded("median TTFT at rate 4, caching off / on: vLLM CPU 0.32", PEERS,
             "vllm_ttft_rate4_off_over_on", fmt=RATIO),
    recorded("median TTFT at rate 4, caching off / on: nanoserve, block_size 32", PEERS,
             "nanoserve_ttft_rate4_off_over_on", fmt=RATIO),
    recorded("median TTFT at rate inf, caching off / on: vLLM CPU 0.32", PEERS,
             "vllm_ttft_inf_off_over_on", fmt=RATIO),
    recorded("median TTFT at rate inf, caching off / on: nanoserve, block_size 32", PEERS,
             "nanoserve_ttft_inf_off_over_on", fmt=RATIO),
    recorded("median TTFT at rate 4 with caching, nanoserve / vLLM CPU 0.32", PEERS,
             "ttft_rate4_nanoserve_over_vllm", fmt=RATIO),
    recorded("output throughput at rate inf with caching, nanoserve / vLLM CPU 0.32", PEERS,
             "throughput_inf_nanoserve_over_vllm", fmt=RATIO),
]
