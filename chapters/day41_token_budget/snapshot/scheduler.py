"""Day 41 snapshot (frozen): a scheduler that spends a token budget every step.

Why this module exists: until today a step computed whatever it admitted. A running decode costs
one token, but a newcomer's prefill costs its whole prompt, so one long prompt made every decode
in the batch wait for it. Now each step has a budget, ``max_num_batched_tokens``, and spends it
in one fixed order:

1. one token for every running request that is decoding (the budget is never below
   ``max_num_seqs``, so all of them always fit);
2. the rest of the prompt of each running request still mid-prefill, oldest first;
3. newcomers, first come first served, never past a blocked head.

With ``chunked_prefill`` the last prompt that does not fit is cut to what is left; without it
that prompt waits, whole, for a step with room. A request mid-prefill keeps its slot, its blocks
and the K/V of the chunks already computed (``num_computed_tokens``), and is given a token only
by the step whose chunk reaches its last prompt token (``SchedulerOutput.sampled``).

Without a budget (``max_num_batched_tokens=None``) it schedules exactly as Day 33 did: grow the
running, decode all of them, admit whole prompts by slots and blocks alone.

    sched = Scheduler(BlockAllocator(64, 4), 8, "incremental", max_num_batched_tokens=16)
    out = sched.schedule()
    out.decode, out.chunks, out.num_batched_tokens  # who decodes, (request, start, n), <= 16

Host-only: no model, no cache. Over Day 14's allocator and Day 33's requests; the one field the
budget adds to a request, ``num_computed_tokens``, is added here by a subclass.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day33_preemption.snapshot.request import Request as _Day33Request
from chapters.day33_preemption.snapshot.request import RequestState

ALLOCATION_POLICIES = ("reserve", "incremental")


class Request(_Day33Request):
    """Day 33's request and the tokens whose K/V a step has been scheduled to write."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_computed_tokens = 0  # scheduled counts as computed: the step will write them


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prefill work for one request in one step: its tokens ``start .. start + n - 1``."""

    request: Request
    start: int
    n: int

    @property
    def completes(self) -> bool:
        return self.start + self.n == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    admitted: list[Request] = field(default_factory=list)  # newly running this step
    decode: list[Request] = field(default_factory=list)  # one token each
    finished: list[Request] = field(default_factory=list)  # released by this call
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting
    chunks: list[Chunk] = field(default_factory=list)  # prompt work, admitted and continuing
    mixed: bool = False  # chunks and decodes share one forward

    @property
    def num_scheduled(self) -> int:
        return len(self.chunks) + len(self.decode)

    @property
    def scheduled(self) -> list[Request]:
        return [c.request for c in self.chunks] + self.decode

    @property
    def sampled(self) -> list[Request]:
        """Who gets a token: every decode, and each chunk that ends its prompt."""
        return [c.request for c in self.chunks if c.completes] + self.decode

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.n for c in self.chunks) + len(self.decode)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int,
                 allocation: str = "reserve",
                 on_release: Callable[[Request], None] | None = None,
                 max_num_batched_tokens: int | None = None, chunked_prefill: bool = True):
        if allocation not in ALLOCATION_POLICIES:
            raise ValueError(f"allocation={allocation!r}; choose one of {ALLOCATION_POLICIES}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens is not None and max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} is below "
                             f"max_num_seqs={max_num_seqs}: a full batch could not decode")
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill and max_num_batched_tokens is not None
        self.allocation = allocation
        self.on_release = on_release
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_num_seqs))  # a heap: the lowest free row first
        self._aborted: list[Request] = []
        self.schedule_calls = 0
        self.admitted_total = 0
        self.finished_total = 0
        self.blocked_on_slots = 0
        self.blocked_on_blocks = 0
        self.blocked_on_budget = 0  # admission stopped: the step's tokens are spent
        self.preemptions = 0
        self.recomputed_tokens = 0
        self._arrivals = 0

    # ------------------------------------------------------------------ requests in

    def add(self, request: Request) -> None:
        if request.state is not RequestState.WAITING:
            raise ValueError(f"request {request.request_id!r} is {request.state.value}, "
                             f"not waiting")
        need = self.allocator.blocks_for_length(request.worst_case_tokens)
        if need > self.allocator.num_blocks:
            raise ValueError(f"request {request.request_id!r}: prompt + max_tokens = "
                             f"{request.worst_case_tokens} tokens need {need} KV blocks; the "
                             f"pool has {self.allocator.num_blocks}: it could never run")
        request.arrival = self._arrivals
        self._arrivals += 1
        self.waiting.append(request)

    def abort(self, request: Request, reason: str = "abort") -> None:
        if request.state is RequestState.WAITING:
            self.waiting.remove(request)
            request.finish(reason)
        elif request.state is RequestState.RUNNING:
            request.finish(reason)
            self.running.remove(request)
            self._release(request)
        else:
            raise ValueError(f"request {request.request_id!r} is already finished")
        self._aborted.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one iteration

    def schedule(self) -> SchedulerOutput:
        """Release, then (under a budget) plan the tokens, grow, and admit with what is left."""
        self.schedule_calls += 1
        out = SchedulerOutput(finished=self._release_finished())
        if self.max_num_batched_tokens is not None:
            return self._schedule_budgeted(out)
        out.preempted = self._grow_running()
        out.decode = list(self.running)
        self._commit(out)
        out.chunks = self._admit()
        out.admitted = [c.request for c in out.chunks]
        return out

    @staticmethod
    def _decoding(r: Request) -> bool:
        """One token left to compute, and it is a generated one: that is a decode."""
        return bool(r.output_token_ids) and r.num_tokens - r.num_computed_tokens == 1

    def _schedule_budgeted(self, out: SchedulerOutput) -> SchedulerOutput:
        left = self.max_num_batched_tokens
        plan: dict[Request, int] = {}  # request -> tokens it computes this step
        by_age = sorted(self.running, key=lambda r: r.arrival)
        for r in by_age:  # 1. decodes: all of them fit, as budget >= max_num_seqs
            if self._decoding(r):
                plan[r] = 1
                left -= 1
        for r in by_age:  # 2. prefills under way, oldest first, the last one cut
            if r not in plan and left > 0:
                plan[r] = min(r.num_tokens - r.num_computed_tokens, left)
                left -= plan[r]
        out.preempted = self._grow_running(plan)
        for r in self.running:
            n = plan.get(r)
            if n is None:
                continue  # the budget ran out before it: it waits a step, row and K/V kept
            if n == 1 and self._decoding(r):
                out.decode.append(r)
            else:
                out.chunks.append(Chunk(r, r.num_computed_tokens, n))
        self._commit(out)
        admitted = self._admit(self.max_num_batched_tokens - out.num_batched_tokens)  # 3.
        out.admitted = [c.request for c in admitted]
        out.chunks += admitted
        out.mixed = self.chunked_prefill
        return out

    def _commit(self, out: SchedulerOutput) -> None:
        for c in out.chunks:
            c.request.num_computed_tokens = c.start + c.n
        for r in out.decode:
            r.num_computed_tokens = r.num_tokens

    def blocks_needed_for(self, request: Request, upto: int | None = None) -> int:
        """Blocks to add before the next forward; ``upto``: the tokens cached after it."""
        target = (request.worst_case_tokens if self.allocation == "reserve"
                  else request.num_tokens if upto is None else upto)
        return max(0, self.allocator.blocks_for_length(target) - len(request.blocks))

    def _grow_running(self, plan: dict[Request, int] | None = None) -> list[Request]:
        """Oldest first, blocks for each one's next tokens (its planned ones, under a
        budget); the youngest is evicted when the pool is dry, and leaves the plan."""
        preempted: list[Request] = []
        for r in sorted(self.running, key=lambda r: r.arrival):
            if r.state is not RequestState.RUNNING:
                continue
            if plan is None:
                need = self.blocks_needed_for(r)
            elif r in plan:
                need = self.blocks_needed_for(r, r.num_computed_tokens + plan[r])
            else:
                continue
            while need > self.allocator.num_free:
                victim = max(self.running, key=lambda v: v.arrival)
                self._preempt(victim)
                preempted.append(victim)
                if plan is not None:
                    plan.pop(victim, None)
                if victim is r:
                    break
            if r.state is RequestState.RUNNING and need:
                r.blocks += self.allocator.allocate(need)
        return preempted

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self._return_resources(victim)
        victim.transition(RequestState.WAITING)
        victim.num_computed_tokens = 0  # its K/V went with its blocks
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _return_resources(self, request: Request) -> None:
        if self.on_release is not None:
            self.on_release(request)
        self.allocator.free(request.blocks)
        request.blocks = []
        heapq.heappush(self._free_slots, request.slot)
        request.slot = None

    def _release(self, request: Request) -> None:
        self._return_resources(request)
        self.finished_total += 1

    def _release_finished(self) -> list[Request]:
        done, self._aborted = self._aborted, []
        for r in [r for r in self.running if r.is_finished]:
            self.running.remove(r)
            self._release(r)
            done.append(r)
        return done

    def _admit(self, left: int | None = None) -> list[Chunk]:
        """First come first served; ``left`` is what the budget still allows (None: no
        budget, whole prompts). A newcomer's first chunk counts as computed at once."""
        admitted = []
        while self.waiting:
            head = self.waiting[0]
            if not self._free_slots:
                self.blocked_on_slots += 1
                break
            n = head.num_tokens
            if left is not None:
                if self.chunked_prefill:
                    n = min(n, left)
                if n < 1 or n > left:
                    self.blocked_on_budget += 1
                    break
            need = self.blocks_needed_for(head, n)
            if not self.allocator.can_allocate(need):
                self.blocked_on_blocks += 1
                break
            self.waiting.popleft()
            if head.num_preemptions:
                self.recomputed_tokens += head.num_tokens
            head.blocks = self.allocator.allocate(need)
            head.num_computed_tokens = n
            head.slot = heapq.heappop(self._free_slots)
            head.transition(RequestState.RUNNING)
            self.running.append(head)
            admitted.append(Chunk(head, 0, n))
            if left is not None:
                left -= n
        self.admitted_total += len(admitted)
        return admitted

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        held = [b for r in self.running for b in r.blocks]
        assert len(held) == len(set(held)) == self.allocator.num_held, "blocks out of balance"
        slots = [r.slot for r in self.running]
        assert len(set(slots)) == len(slots), "two running requests share a slot"
        assert sorted(slots + self._free_slots) == list(range(self.max_num_seqs)), "slot lost"
        assert all(0 <= r.num_computed_tokens <= r.num_tokens for r in self.running)
