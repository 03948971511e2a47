"""Day 7's numbers: the work the cache removes, counted exactly, and what it costs in memory."""

from __future__ import annotations

import functools
import time

import torch

from chapters.common import (
    LLAMA_3_2_1B,
    SHIPPED,
    ForwardCounter,
    best_of,
    hf_checkpoint,
    meta_model,
    reference_prompts,
)
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day04_generate.snapshot.generate import generate_uncached
from chapters.runner import exact, timed

from .snapshot.generate import generate_cached
from .snapshot.kv_cache import KVCache

P, N = 16, 64  # the counting workload: a 16-token prompt, 64 new tokens, no EOS


@functools.cache
def _counts() -> tuple[int, int]:
    """Token positions through the model's forward, counted by a hook on the model (not the
    generators' own ``tokens_computed``, which they could get wrong by themselves)."""
    model = load_model(hf_checkpoint("gqa"))
    prompt = list(range(2, 2 + P))
    counted = []
    for generate in (generate_uncached, generate_cached):
        with ForwardCounter(model) as fc:
            generate(model, prompt, N)
        counted.append(fc.positions)
    return counted[0], counted[1]


def identical_replies() -> int:
    from nanoserve.testing import CONFIGS

    same = 0
    for name in CONFIGS:
        model = load_model(hf_checkpoint(name))
        for prompt in reference_prompts():
            same += (generate_uncached(model, prompt, 32).token_ids
                     == generate_cached(model, prompt, 32).token_ids)
    return same


def cpu_speedup(new_tokens: int = 256) -> float:
    """Wall-clock ratio, uncached / cached, on the shipped model: interleaved rounds on one
    thread, each keeping its fastest run."""
    model = load_model(SHIPPED)
    prompt = list(range(2, 2 + P))

    def timed(fn):
        def run():
            t0 = time.perf_counter()
            fn(model, prompt, new_tokens)
            return time.perf_counter() - t0
        return run

    best = best_of(2, {"uncached": timed(generate_uncached), "cached": timed(generate_cached)},
                   lambda seconds: seconds)
    return best["uncached"] / best["cached"]


def reservation_bytes(tokens: int) -> int:
    """Bytes of K and V that this snapshot's KVCache allocates for one sequence of ``tokens``
    positions, on the meta device in the Llama-3.2-1B shape, bf16."""
    return KVCache.for_model(meta_model(LLAMA_3_2_1B, torch.bfloat16), 1, tokens).nbytes()


CLAIMS = [
    exact(f"token-forwards without a cache (P={P}, N={N})", lambda: _counts()[0],
          fmt="{:,}".format),
    exact(f"token-forwards with the cache (P={P}, N={N})", lambda: _counts()[1]),
    exact("work removed by the cache (ratio)", lambda: _counts()[0] / _counts()[1],
          fmt="{:.1f}x".format),
    exact("greedy replies identical, cached vs uncached", identical_replies,
          fmt="{} of 20".format),
    timed("wall-clock speed-up on this CPU (nanoserve-tiny, 256 new tokens)", cpu_speedup,
          fmt="{:.1f}x".format),
    exact("KV cache per token, Llama-3.2-1B shape, bf16", lambda: reservation_bytes(1) / 1024,
          fmt="{:.0f} KiB".format),
    exact("contiguous reservation for one 131,072-token sequence",
          lambda: reservation_bytes(131072) / 2**30, fmt="{:.1f} GiB".format),
]
