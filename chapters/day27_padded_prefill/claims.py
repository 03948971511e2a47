"""Day 27's numbers: one padded forward equals one forward per prompt, and what padding costs."""

from __future__ import annotations

import functools

import torch

from chapters.common import ForwardCounter, hf_checkpoint
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.runner import bound, exact

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


@functools.cache
def counted() -> dict:
    """The batch prefilled both ways on one model, with a hook on its forward: calls and the
    (B, T) each call was given, and the tokens the cache holds afterwards."""
    model = load_model(hf_checkpoint("gqa"))
    out = {}
    for mode in ("padded", "one per prompt"):
        pool = BlockAllocator(32, 4)
        cache = BatchedPagedKVCache.for_model(model, 32, 4, 4, 64)
        rows = list(range(len(LENGTHS)))
        for row, n in zip(rows, LENGTHS, strict=True):
            cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n)))
        with ForwardCounter(model) as fc:
            if mode == "padded":
                padded_prefill(model, cache, rows, _prompts())
            else:
                for row, p in zip(rows, _prompts(), strict=True):
                    padded_prefill(model, cache, [row], [p])
        out[mode] = {"calls": fc.calls, "positions": fc.positions, "shapes": fc.shapes,
                     "cached": sum(cache.lengths[r] for r in rows)}
    return out


def padding_share() -> float:
    """1 - tokens the cache holds / positions the padded forward ran."""
    padded = counted()["padded"]
    return 1 - padded["cached"] / padded["positions"]


CLAIMS = [
    bound("padded prefill vs per-prompt prefill, max relative logit difference",
          padded_vs_alone, fmt="{:.2e}".format),
    exact("forward passes for the batch, padded vs one per prompt",
          lambda: f"{counted()['padded']['calls']} vs {counted()['one per prompt']['calls']}"),
    exact("positions in the padded batch (B x T of its one forward)",
          lambda: "{} x {} = {}".format(*counted()["padded"]["shapes"][0],
                                        counted()["padded"]["positions"])),
    exact("of which padding (ratio: 1 - tokens cached / positions)", padding_share,
          fmt="{:.1%}".format),
]
