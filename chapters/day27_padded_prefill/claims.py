"""Day 27's numbers: one padded forward equals one forward per prompt, and what padding costs."""

from __future__ import annotations

import torch

from chapters.common import hf_checkpoint
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.runner import at_most, exact

from .snapshot.prefill import padded_prefill

LENGTHS = [5, 17, 1, 9]  # a ragged batch of prompts


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(27)
    return [torch.randint(1, 255, (n,), generator=g).tolist() for n in LENGTHS]


@torch.inference_mode()
def padded_vs_alone() -> float:
    """Worst relative difference of each row's last-token logits, over the 5 configs."""
    from nanoserve.testing import CONFIGS, relative_logit_error

    worst = 0.0
    for name in CONFIGS:
        model = load_model(hf_checkpoint(name))
        pool = BlockAllocator(32, 4)
        cache = BatchedPagedKVCache.for_model(model, 32, 4, 4, 64)
        rows = [2, 0, 3, 1]
        for row, n in zip(rows, LENGTHS, strict=True):
            cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n)))
        batched = padded_prefill(model, cache, rows, _prompts())
        for b, p in enumerate(_prompts()):
            alone = model.compute_logits(model(torch.tensor([p]), torch.arange(len(p))[None]))
            worst = max(worst, relative_logit_error(batched[b], alone[0, -1]))
    return worst


def padding_share() -> float:
    B, T = len(LENGTHS), max(LENGTHS)
    return 1 - sum(LENGTHS) / (B * T)


CLAIMS = [
    at_most("padded prefill vs per-prompt prefill, max relative logit difference",
            "≤ 1e-5", 1e-5, padded_vs_alone),
    exact("forward passes for the batch, padded vs one per prompt", "1 vs 4",
          lambda: f"1 vs {len(LENGTHS)}"),
    exact("positions in the padded (4 x 17) batch", "68", lambda: len(LENGTHS) * max(LENGTHS)),
    exact("of which padding", "52.9%", padding_share, fmt="{:.1%}".format),
]
