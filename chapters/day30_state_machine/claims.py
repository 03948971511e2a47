"""Day 30's numbers: every figure in the log's "Why it matters", counted by the host-only harness.

Conventions (pinned in the prose): an iteration is one schedule() plus one model step, and counts
as a forward pass when it schedules anything; a prefill produces a request's first token;
"issued" counts rows computed, "useful" counts tokens kept.
"""

from __future__ import annotations

import functools

from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.runner import exact

from .snapshot.harness import run_scheduled, run_static
from .snapshot.request import Request
from .snapshot.scheduler import Scheduler, SchedulerOutput

GEN = [4, 4, 4, 4, 4, 4, 4, 32]  # the Day-29 shape: seven rows of 4 tokens, one of 32


@functools.cache
def scheduled(requests: int) -> dict:
    return run_scheduled(slots=8, block_size=4, pool_tokens=1024, prompt_len=5, gen_lens=GEN,
                         requests=requests)


@functools.cache
def static(requests: int) -> dict:
    return run_static(slots=8, prompt_len=5, gen_lens=GEN, requests=requests)


class AdmitThenRelease(Scheduler):
    """The bug the order guards against: admit what fits, then release the finished, so a slot
    freed in iteration N is refilled only by the call after."""

    def schedule(self) -> SchedulerOutput:
        self.schedule_calls += 1
        admitted = self._admit()
        out = SchedulerOutput(finished=self._release_finished())
        out.decode = [r for r in self.running if r not in admitted]
        out.admitted = admitted
        return out


def forward_passes_with(cls: type[Scheduler], requests: int = 24) -> int:
    """The harness's loop over ``cls``: 8 slots, block_size 4, a 1,024-token pool, the Day-29
    shape repeated; returns the forward passes (calls that scheduled anything)."""
    s = cls(BlockAllocator(256, 4), 8)
    reqs = [Request(i, [1] * 5, max_tokens=GEN[i % len(GEN)]) for i in range(requests)]
    for r in reqs:
        s.add(r)
    passes = 0
    while s.has_unfinished():
        out = s.schedule()
        rows = out.admitted + out.decode
        passes += bool(rows)
        for r in rows:
            r.append_token(1)
    if not all(len(r.output_token_ids) == r.max_tokens for r in reqs):
        raise AssertionError("a request lost tokens")
    return passes


def reservation() -> tuple[int, int, float]:
    """Four requests, 8-token prompts, 200-token budgets, block_size 16, after the prefill."""
    pool = BlockAllocator(64, 16)
    s = Scheduler(pool, 4)
    reqs = [Request(i, [7] * 8, max_tokens=200) for i in range(4)]
    for r in reqs:
        s.add(r)
    for r in s.schedule().admitted:
        r.append_token(5)  # the prefill's first token
    held = sum(pool.blocks_for_length(r.num_tokens) for r in reqs)
    return sum(len(r.blocks) for r in reqs), held, s.reservation_waste()


def first_token_stop() -> str:
    pool = BlockAllocator(64, 16)
    s = Scheduler(pool, 4)
    r = Request(0, [7] * 8, max_tokens=200, eos_token_ids=frozenset({2}))
    s.add(r)
    s.schedule()
    r.append_token(2)  # EOS at once
    return f"{len(r.blocks) - pool.blocks_for_length(r.num_tokens)} of {len(r.blocks)}"


CLAIMS = [
    exact("Day-29 shape, scheduled: issued for useful",
          lambda: f"{scheduled(8)['issued_tokens']} issued for {scheduled(8)['useful_tokens']} "
                  f"useful"),
    exact("Day-29 shape, static batch: row-steps issued",
          lambda: f"{static(8)['issued_tokens']} issued"),
    exact("forward work the scheduler removes (ratio)",
          lambda: 1 - scheduled(8)["issued_tokens"] / static(8)["issued_tokens"],
          fmt="{:.1%}".format),
    exact("iteration after which r0's answer is handed back, scheduled vs static",
          lambda: f"{scheduled(8)['finish_iteration'][0]} against "
                  f"{static(8)['returned_iteration'][0]}"),
    exact("24 requests through 8 slots: forward passes, scheduled",
          lambda: scheduled(24)["forward_passes"]),
    exact("24 requests through 8 slots: `schedule()` calls, scheduled",
          lambda: scheduled(24)["schedule_calls"]),
    exact("24 requests through 8 slots: forward passes, three static waves",
          lambda: static(24)["forward_passes"]),
    exact("makespan cut, forward passes (ratio)",
          lambda: static(24)["forward_passes"] / scheduled(24)["forward_passes"],
          fmt="{:.1f}x".format),
    exact("less issued work, 24 requests (ratio, 768 / 180)",
          lambda: static(24)["issued_tokens"] / scheduled(24)["issued_tokens"],
          fmt="{:.1f}x".format),
    exact("worst-case reservation, 4 requests, 8-token prompts, 200-token budgets, block_size 16",
          lambda: "{} blocks reserved against {} occupied".format(*reservation()[:2])),
    exact("`reservation_waste()` in that state", lambda: reservation()[2],
          fmt="{:.2f}".format),
    exact("a request that stops at its first token: blocks held for nothing", first_token_stop),
    exact("24 requests through 8 slots: forward passes, release-then-admit vs the order swapped",
          lambda: f"{forward_passes_with(Scheduler)} vs {forward_passes_with(AdmitThenRelease)}"),
]
