"""Day 29 snapshot (frozen): a static batch, greedy, with every bill written down.

A wave of up to ``max_num_seqs`` requests is prefilled together and decoded together until its
longest member is done. A member that finished early is *held*: still computed every step (its
last token rewritten in place), still holding its blocks, and handed back only when the wave ends.

Counting conventions: an iteration is one forward pass of the model. The prefill is iteration 1
and produces every row's first token; each decode step is one more iteration and one more token
per live row. ``issued`` counts rows in each forward (held rows included); ``useful`` counts
tokens handed back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
from chapters.day28_batched_decode.snapshot.decode import batched_decode


@dataclass
class Reply:
    token_ids: list[int] = field(default_factory=list)
    finish_iteration: int = 0  # the iteration that produced its last token
    returned_iteration: int = 0  # the iteration after which the batch handed it back
    start_time: float = 0.0
    last_token_time: float = 0.0
    returned_time: float = 0.0


@dataclass
class StaticRun:
    replies: list[Reply]
    forward_passes: int
    issued: int
    useful: int
    blocks_reserved: int  # blocks held at the fullest moment

    @property
    def waste(self) -> float:
        return 1 - self.useful / self.issued


def run_static(model: Llama, prompts: list[list[int]], max_tokens: list[int],
               block_size: int, num_blocks: int, max_num_seqs: int) -> StaticRun:
    """Greedy, EOS ignored: request i stops after exactly max_tokens[i] tokens."""
    pool = BlockAllocator(num_blocks, block_size)
    cache = BatchedPagedKVCache.for_model(model, num_blocks, block_size, max_num_seqs,
                                          model.cfg.max_position_embeddings)
    replies = [Reply() for _ in prompts]
    passes = issued = peak = 0
    for w in range(0, len(prompts), max_num_seqs):
        wave = list(range(w, min(w + max_num_seqs, len(prompts))))
        rows = list(range(len(wave)))
        for row, i in zip(rows, wave, strict=True):
            cache.tables[row].extend(pool.allocate(
                pool.blocks_for_length(len(prompts[i]) + max_tokens[i])))
        peak = max(peak, pool.num_blocks - pool.num_free)
        t0 = time.perf_counter()
        logits = padded_prefill(model, cache, rows, [prompts[i] for i in wave])
        passes, issued, iteration, done = passes + 1, issued + len(rows), 1, set()
        while True:
            now = time.perf_counter()
            for row, i in zip(rows, wave, strict=True):
                if row in done:
                    continue
                r = replies[i]
                r.token_ids.append(int(logits[row].argmax()))
                r.start_time, r.last_token_time = t0, now
                if len(r.token_ids) == max_tokens[i]:
                    done.add(row)
                    r.finish_iteration = iteration
            if len(done) == len(rows):
                break
            logits = batched_decode(model, cache, rows,
                                    [replies[i].token_ids[-1] for i in wave], frozenset(done))
            passes, issued, iteration = passes + 1, issued + len(rows), iteration + 1
        end = time.perf_counter()
        for row, i in zip(rows, wave, strict=True):
            replies[i].returned_iteration, replies[i].returned_time = iteration, end
            pool.free(cache.reset_row(row))
    assert pool.num_free == pool.num_blocks
    return StaticRun(replies, passes, issued, sum(len(r.token_ids) for r in replies), peak)
