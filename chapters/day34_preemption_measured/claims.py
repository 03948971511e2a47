"""Day 34's numbers: preemption in the measurement, on this CPU with nanoserve-tiny.

Workload (batchbench): 12 requests, seed 0, prompts of 4-24 random tokens, 8-40 greedy tokens
each with EOS ignored, block_size 4, 8 slots; a cramped pool of 24 blocks against the default.
The counts do not depend on timing or on what the model says: they are exact.
"""

from __future__ import annotations

import functools

from chapters.common import SHIPPED, best_of
from chapters.runner import exact, timed

from .snapshot.report import Record, report

KW = dict(dtype="float32", block_size=4, max_num_seqs=8)


def _engines():
    from nanoserve import LLM
    from nanoserve.bench.batchbench import workload

    cramped, roomy = LLM(SHIPPED, num_kv_blocks=24, **KW), LLM(SHIPPED, **KW)
    prompts, gens = workload(12, 0, (4, 24), (8, 40), cramped.config.vocab_size)
    return cramped, roomy, prompts, gens


def _report(bench: dict) -> dict:
    records = [Record(n, 0.0, t) for n, t in zip(bench["preemptions_per_request"],
                                                 bench["latencies_s"], strict=True)]
    return report(records, bench["recomputed_tokens"], bench["tokens_computed"])


@functools.cache
def counted() -> tuple[dict, dict, dict]:
    """(cramped report, cramped batchbench, roomy batchbench) from one untimed run each: the
    counts do not depend on the clock."""
    from nanoserve.bench.batchbench import run

    cramped, roomy, prompts, gens = _engines()
    bench_c, bench_r = run(cramped, prompts, gens), run(roomy, prompts, gens)
    bench_c["iterations"], bench_r["iterations"] = cramped.stats.iterations, roomy.stats.iterations
    return _report(bench_c), bench_c, bench_r


@functools.cache
def runs() -> tuple[dict, dict, dict]:
    """The same, for the times: after a warm-up, three interleaved rounds on one thread; each
    engine keeps its least disturbed run."""
    from nanoserve.bench.batchbench import run

    cramped, roomy, prompts, gens = _engines()
    run(cramped, prompts[:2], gens[:2])  # warm-up, outside the measurement
    run(roomy, prompts[:2], gens[:2])
    best = best_of(3, {"cramped": lambda: run(cramped, prompts, gens),
                       "roomy": lambda: run(roomy, prompts, gens)}, lambda r: r["wall_s"])
    return _report(best["cramped"]), best["cramped"], best["roomy"]


def positions() -> str:
    """Token positions the model computed in each run, and the cramped run's re-prefills."""
    c, r = counted()[1], counted()[2]
    extra = c["tokens_computed"] - r["tokens_computed"]
    return (f"cramped {c['tokens_computed']}, of them {c['recomputed_tokens']} recomputed; "
            f"roomy {r['tokens_computed']}; {extra} more ({extra / r['tokens_computed']:.0%})")


def swap_or_recompute(tokens: int = 1000) -> str:
    """A victim of ``tokens`` in the Llama-3.2-1B shape, bf16: the K/V bytes a swap moves each
    way (Day 7's contiguous cache for one position, on the meta device, times the tokens) and
    the FLOPs a recompute spends (two per parameter per token, parameters counted on the
    model)."""
    import torch

    from chapters.common import LLAMA_3_2_1B, meta_model
    from chapters.day07_kv_cache.snapshot.kv_cache import KVCache

    model = meta_model(LLAMA_3_2_1B, torch.bfloat16)
    each_way = KVCache.for_model(model, 1, 1).nbytes() * tokens / 2**20
    flops = 2 * model.num_parameters() * tokens
    return (f"{each_way:.2f} MiB each way, {2 * each_way:.1f} MiB out and back; "
            f"{flops / 1e12:.1f} TFLOP")


def same_tokens() -> int:
    return sum(a == b for a, b in zip(counted()[1]["token_ids"], counted()[2]["token_ids"],
                                      strict=True))


CLAIMS = [
    exact("preemptions, cramped pool (24 blocks)", lambda: counted()[0]["preemptions"]),
    exact("requests preempted at least once",
          lambda: f"{counted()[0]['preempted_requests']} of 12"),
    exact("preemptions per request", lambda: counted()[0]["preemptions_per_request"]),
    exact("recompute bill: share of all token positions computed",
          lambda: counted()[0]["recompute_share"], fmt="{:.1%}".format),
    exact("tokens identical, cramped vs roomy", lambda: f"{same_tokens()} of 12"),
    timed("mean latency, preempted / straight-through requests (same run, this CPU)",
          lambda: runs()[0]["latency_preempted"] / runs()[0]["latency_straight"],
          fmt="{:.2f}x".format),
    timed("wall clock, cramped / roomy, same workload (this CPU)",
          lambda: runs()[1]["wall_s"] / runs()[2]["wall_s"], fmt="{:.2f}x".format),
    exact("preemptions in the roomy run", lambda: counted()[2]["preemptions"]),
    exact("token positions computed, cramped and roomy", positions),
    exact("iterations: cramped, roomy",
          lambda: f"{counted()[1]['iterations']}, {counted()[2]['iterations']}"),
    exact("preemptions of r0 to r11, cramped",
          lambda: ", ".join(map(str, counted()[1]["preemptions_per_request"]))),
    exact("a 1,000-token victim, Llama-3.2-1B shape, bf16: K/V a swap moves; FLOPs a "
          "recompute spends", swap_or_recompute),
]
