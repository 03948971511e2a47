"""Day 45's frozen workload and cache model against the package.

The package's ``prefix_repetition_requests`` must draw exactly the frozen generator's requests,
and the frozen model of a full-block prefix cache must find what the package's own caching
allocator finds when the same prompts are admitted through the live scheduler, one at a time,
each run to its end (no model: the scheduler and the allocator only).
"""

from __future__ import annotations

import pytest

from chapters.day45_prefix_measured.snapshot.workload import cached_tokens, prefix_repetition
from nanoserve.bench.workload import prefix_repetition_requests, sample_requests
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler


@pytest.mark.parametrize("args", [
    (16, 512, 32, 4, 16, 2048, 0),  # the chapter's workload
    (12, 7, 3, 3, 2, 50, 9),
    (4, 0, 5, 2, 1, 10, 1),  # no shared prefix at all
])
def test_package_generator_equals_the_frozen_one(args):
    live, frozen = prefix_repetition_requests(*args), prefix_repetition(*args)
    assert [(r.prompt, r.prompt_len, r.expected_output_len) for r in live] == \
        [(r.prompt, r.prompt_len, r.expected_output_len) for r in frozen]
    opts = dict(zip(("prefix_len", "suffix_len", "num_prefixes", "output_len"), args[1:5],
                    strict=True))
    via = sample_requests("prefix_repetition", args[0], args[5], args[6], **opts)
    assert [r.prompt for r in via] == [r.prompt for r in frozen]


def _live_hits(prompts: list[list[int]], block_size: int, warm: list[list[int]]) -> int:
    """Hits the package's scheduler counts, each prompt admitted and finished alone."""
    s = Scheduler(KVCacheManager(4096, block_size, prefix_caching=True), 1,
                  allocation="incremental")
    hits = 0
    for i, ids in enumerate([*warm, *prompts]):
        before = s.prefix_cache_hits
        s.add(Request(str(i), ids, 1))
        out = s.schedule()
        for r in out.sampled:
            r.append_token(1)  # one token: finished; its blocks stay cached when released
        if i >= len(warm):
            hits += s.prefix_cache_hits - before
    s.schedule()
    return hits


@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_the_frozen_cache_model_finds_what_the_package_finds(block_size):
    reqs = prefix_repetition(12, 40, 9, 3, 1, vocab_size=60, seed=5)
    prompts = [r.prompt for r in reqs]
    for warm in ([], [prompts[0]]):
        assert cached_tokens(prompts, block_size, warm) == \
            _live_hits(prompts, block_size, warm)


def test_the_chapters_hits_follow_from_the_groups():
    """Block 16, probe first: the first request finds all but its last block (33 x 16), the
    other 15 find the 512-id prefix except the first of each of the three other groups."""
    prompts = [r.prompt for r in prefix_repetition(16, 512, 32, 4, 16, 2048, 0)]
    assert cached_tokens(prompts, 16, warm=[prompts[0]]) == 33 * 16 + 12 * 512 == 6672
    assert cached_tokens(prompts, 32, warm=[prompts[0]]) == 13 * 512
