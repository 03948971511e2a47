"""Day 27 snapshot (frozen): the padded forward over the paged cache.

Prompts of different lengths are right-padded into one (B, T) batch. Each row gets its own
positions (starting where its cache row ends), padding sits at position 0 and writes nothing, and
each row is read back at its own last real token. ``forward_rows`` is also what a decode step
calls, with one token per row.
"""

from __future__ import annotations

import torch

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache


@torch.inference_mode()
def forward_rows(model: Llama, cache: BatchedPagedKVCache, rows: list[int],
                 token_lists: list[list[int]], hold: frozenset[int] = frozenset()
                 ) -> torch.Tensor:
    """Append token_lists[b] to cache row rows[b] -> last-token logits (B, V)."""
    lens = [len(t) for t in token_lists]
    B, T = len(rows), max(lens)
    ids = torch.zeros(B, T, dtype=torch.long)  # (B, T), right-padded
    pos = torch.zeros(B, T, dtype=torch.long)  # (B, T)
    for b, (row, toks) in enumerate(zip(rows, token_lists, strict=True)):
        start = cache.lengths[row]
        ids[b, :len(toks)] = torch.tensor(toks)
        pos[b, :len(toks)] = torch.arange(start, start + len(toks))
    cache.begin_step(rows, lens, hold)
    h = model(ids, pos, cache)  # (B, T, E)
    cache.end_step()
    return model.compute_logits(h[torch.arange(B), torch.tensor(lens) - 1])  # (B, V)


def padded_prefill(model: Llama, cache: BatchedPagedKVCache, rows: list[int],
                   prompts: list[list[int]]) -> torch.Tensor:
    return forward_rows(model, cache, rows, prompts)
