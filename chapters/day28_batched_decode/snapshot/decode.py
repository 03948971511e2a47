"""Day 28 snapshot (frozen): one batched decode step over the paged cache.

Each of B rows appends one token at its own position; attention gathers each row's context into
a (B, S) rectangle whose width S is the *longest* context in the batch, and masks the rest. The
width is the price: a short row beside a long one is gathered and masked at the long one's width.
"""

from __future__ import annotations

import torch

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import forward_rows


def batched_decode(model: Llama, cache: BatchedPagedKVCache, rows: list[int],
                   tokens: list[int], hold: frozenset[int] = frozenset()) -> torch.Tensor:
    """One token per row -> next-token logits (B, V)."""
    return forward_rows(model, cache, rows, [[t] for t in tokens], hold)


def rectangle_width(cache: BatchedPagedKVCache, rows: list[int]) -> int:
    """Positions each row gathers in the next decode step: the longest row's context + 1."""
    return max(cache.lengths[r] for r in rows) + 1
