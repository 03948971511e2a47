"""Day 28's numbers: a batched decode step equals decoding each row alone, the width of the
rectangle a short row pays for, and what batching buys on this CPU."""

from __future__ import annotations

import functools
import time

import torch

from chapters.common import SHIPPED, best_of, hf_checkpoint
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
from chapters.runner import bound, exact, timed

from .snapshot.decode import batched_decode

CONTEXTS = [4, 41, 12]


def _setup(model, contexts, steps, block_size=4):
    pool = BlockAllocator(256, block_size)
    cache = BatchedPagedKVCache.for_model(model, 256, block_size, len(contexts), 512)
    g = torch.Generator().manual_seed(28)
    prompts = [torch.randint(1, 255, (n,), generator=g).tolist() for n in contexts]
    rows = list(range(len(contexts)))
    for row, n in zip(rows, contexts, strict=True):
        cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n + steps)))
    return cache, rows, prompts


@torch.inference_mode()
def batched_vs_alone(steps: int = 6) -> float:
    from nanoserve.testing import CONFIGS, relative_logit_error

    worst = 0.0
    for name in CONFIGS:
        model = load_model(hf_checkpoint(name))
        cache, rows, prompts = _setup(model, CONTEXTS, steps)
        logits = padded_prefill(model, cache, rows, prompts)
        seqs = [list(p) for p in prompts]
        for _ in range(steps):
            nxt = logits.argmax(-1).tolist()
            logits = batched_decode(model, cache, rows, nxt)
            for b, t in enumerate(nxt):
                seqs[b].append(t)
                alone = model.compute_logits(model(torch.tensor([seqs[b]]),
                                                   torch.arange(len(seqs[b]))[None]))[0, -1]
                worst = max(worst, relative_logit_error(logits[b], alone))
    return worst


@functools.cache
@functools.cache
def gathered() -> tuple[int, int, int, int]:
    """One real decode step after the prefill, contexts 4, 41 and 12. The cache's begin_step is
    wrapped on this instance to keep the layout it builds: the width of the (B, S) rectangle of
    cells the step reads, the short row's own context length, the cells the whole rectangle
    gathers and the context positions the rows hold."""
    model = load_model(hf_checkpoint("gqa"))
    cache, rows, prompts = _setup(model, CONTEXTS, 1)
    logits = padded_prefill(model, cache, rows, prompts)
    layouts, begin = [], cache.begin_step

    def keep(*args, **kwargs):
        layouts.append(begin(*args, **kwargs))
        return layouts[-1]

    cache.begin_step = keep
    batched_decode(model, cache, rows, logits.argmax(-1).tolist())
    (layout,) = layouts
    return (layout.read_cells.shape[1], int(layout.context_lens[0]), layout.read_cells.numel(),
            int(layout.context_lens.sum()))


@torch.inference_mode()
def cpu_batching_speedup(rows_n: int = 8, steps: int = 32, rounds: int = 3) -> float:
    """nanoserve-tiny: 8 rows decoded in one forward per step vs one forward per row per step.
    The two modes are interleaved, round after round, on one thread (best_of), and each keeps
    its best time, so a burst of background load cannot land on one mode only."""
    model = load_model(SHIPPED)

    def run(batched: bool):
        def once() -> float:
            cache, rows, prompts = _setup(model, [16] * rows_n, steps)
            padded_prefill(model, cache, rows, prompts)
            toks = [1] * rows_n
            t0 = time.perf_counter()
            for _ in range(steps):
                if batched:
                    batched_decode(model, cache, rows, toks)
                else:
                    for r in rows:
                        batched_decode(model, cache, [r], [toks[r]])
            return time.perf_counter() - t0
        return once

    best = best_of(rounds, {"batched": run(True), "one row at a time": run(False)},
                   lambda seconds: seconds)
    return best["one row at a time"] / best["batched"]


CLAIMS = [
    bound("batched decode vs each row alone, max relative logit difference", batched_vs_alone,
          fmt="{:.2e}".format),
    exact("positions gathered per row when contexts are 4, 41 and 12 (+1 new)",
          lambda: gathered()[0]),
    exact("the 4-token row's gathered width against its own 5 positions (ratio)",
          lambda: gathered()[0] / gathered()[1], fmt="{:.1f}x".format),
    exact("the whole step: positions gathered per layer, positions used; the short row's "
          "masked ones", lambda: f"{gathered()[2]} gathered, {gathered()[3]} used; "
                                 f"{gathered()[0] - gathered()[1]} masked for the 4-token row"),
    timed("decode speed-up on this CPU, 8 rows batched vs one at a time (nanoserve-tiny)",
          cpu_batching_speedup, fmt="{:.1f}x".format),
]
