"""Day 7's numbers: the work the cache removes, counted exactly, and what it costs in memory."""

from __future__ import annotations

import functools
import time

from chapters.common import LLAMA_3_2_1B, SHIPPED, best_of, hf_checkpoint, reference_prompts
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day04_generate.snapshot.generate import generate_uncached
from chapters.runner import at_least, exact

from .snapshot.generate import generate_cached

P, N = 16, 64  # the counting workload: a 16-token prompt, 64 new tokens, no EOS


@functools.cache
def _counts() -> tuple[int, int]:
    model = load_model(hf_checkpoint("gqa"))
    prompt = list(range(2, 2 + P))
    return (generate_uncached(model, prompt, N).tokens_computed,
            generate_cached(model, prompt, N).tokens_computed)


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


def kv_bytes_per_token(cfg: dict, bytes_per_value: int) -> int:
    """K and V, for every layer and KV head."""
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * \
        bytes_per_value


CLAIMS = [
    exact(f"token-forwards without a cache (P={P}, N={N})", "3,040", lambda: _counts()[0],
          fmt="{:,}".format),
    exact(f"token-forwards with the cache (P={P}, N={N})", "79", lambda: _counts()[1]),
    exact("work removed by the cache", "38.5x", lambda: _counts()[0] / _counts()[1],
          fmt="{:.1f}x".format),
    exact("greedy replies identical, cached vs uncached (5 configs x 4 prompts)", "20 of 20",
          identical_replies, fmt="{} of 20".format),
    at_least("wall-clock speed-up on this CPU (nanoserve-tiny, 256 new tokens)", "≥ 3x", 3.0,
             cpu_speedup, fmt="{:.1f}x".format),
    exact("KV cache per token, Llama-3.2-1B shape, bf16", "32 KiB",
          lambda: kv_bytes_per_token(LLAMA_3_2_1B, 2) / 1024, fmt="{:.0f} KiB".format),
    exact("contiguous reservation for one 131,072-token sequence", "4.0 GiB",
          lambda: kv_bytes_per_token(LLAMA_3_2_1B, 2) * 131072 / 2**30,
          fmt="{:.1f} GiB".format),
]
