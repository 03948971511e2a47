"""Day 7 snapshot (frozen): greedy generation over the contiguous KV cache.

The prompt is run once (prefill), filling the cache; every later step runs exactly one token
(decode) and attends over the cached keys and values. A reply of N tokens after a P-token prompt
costs P + (N - 1) token-forwards instead of N*P + N(N-1)/2.
"""

from __future__ import annotations

import torch

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day04_generate.snapshot.generate import Generation

from .kv_cache import KVCache


@torch.inference_mode()
def generate_cached(model: Llama, prompt: list[int], max_new_tokens: int,
                    eos_ids: frozenset[int] = frozenset()) -> Generation:
    cache = KVCache.for_model(model, batch=1, max_len=len(prompt) + max_new_tokens)
    step_ids, out, computed = list(prompt), [], 0
    for _ in range(max_new_tokens):
        start = cache.length
        pos = torch.arange(start, start + len(step_ids))[None]  # (1, T)
        h = model(torch.tensor([step_ids]), pos, cache)  # (1, T, E)
        cache.advance(len(step_ids))
        computed += len(step_ids)
        token = int(model.compute_logits(h[0, -1]).argmax())
        out.append(token)
        if token in eos_ids:
            return Generation(out, "stop", computed)
        step_ids = [token]
    return Generation(out, "length", computed)
