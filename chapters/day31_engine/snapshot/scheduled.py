"""Day 31 snapshot (frozen): the scheduled loop on the real model, greedy, bills written down.

Each iteration: ``schedule()`` (release, then admit), a padded prefill for the admitted, one
batched decode for the running, and every token fed back through ``append_token``. A request's
cache row is its slot; ``on_release`` resets the row before anyone else can land on it. The
counting matches Day 29's snapshot, so the two can be set side by side: an iteration that runs
the model is one step of the timeline, ``issued`` counts rows computed, and a request is handed
back by the ``schedule()`` call that releases it.
"""

from __future__ import annotations

import time

import torch

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import forward_rows
from chapters.day29_static_batch.snapshot.static_batch import Reply, StaticRun
from chapters.day30_state_machine.snapshot.request import Request
from chapters.day30_state_machine.snapshot.scheduler import Scheduler


@torch.inference_mode()
def run_scheduled(model: Llama, prompts: list[list[int]], max_tokens: list[int],
                  block_size: int, num_blocks: int, max_num_seqs: int) -> StaticRun:
    """Greedy, EOS ignored; the same result type as Day 29's run_static."""
    pool = BlockAllocator(num_blocks, block_size)
    cache = BatchedPagedKVCache.for_model(model, num_blocks, block_size, max_num_seqs,
                                          model.cfg.max_position_embeddings)

    def on_release(r: Request) -> None:
        cache.reset_row(r.slot)

    sched = Scheduler(pool, max_num_seqs, on_release=on_release)
    reqs = [Request(i, p, max_tokens=m) for i, (p, m) in enumerate(zip(prompts, max_tokens,
                                                                         strict=True))]
    replies = [Reply() for _ in reqs]
    for r in reqs:
        sched.add(r)
    t0 = time.perf_counter()
    passes = issued = iteration = peak = 0
    while True:
        out = sched.schedule()
        now = time.perf_counter()
        for r in out.finished:
            replies[r.request_id].returned_iteration = iteration
            replies[r.request_id].returned_time = now
        if out.num_scheduled == 0:
            break
        iteration += 1
        peak = max(peak, pool.num_blocks - pool.num_free)
        for group, tokens in ((out.admitted, [r.token_ids for r in out.admitted]),
                              (out.decode, [[r.output_token_ids[-1]] for r in out.decode])):
            if not group:
                continue
            for r in group:  # BlockTable.extend: the row learns the request's blocks
                table = cache.tables[r.slot]
                table.extend(r.blocks[len(table):])
            logits = forward_rows(model, cache, [r.slot for r in group], tokens)
            passes, issued = passes + 1, issued + len(group)
            now = time.perf_counter()
            for r, tok in zip(group, logits.argmax(-1).tolist(), strict=True):
                rep = replies[r.request_id]
                rep.start_time, rep.last_token_time = t0, now
                if r.append_token(tok):
                    rep.finish_iteration = iteration
                rep.token_ids = list(r.output_token_ids)
    assert pool.num_free == pool.num_blocks
    return StaticRun(replies, passes, issued, sum(len(r.token_ids) for r in replies), peak)
