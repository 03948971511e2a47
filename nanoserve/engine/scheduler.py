"""Scheduler: who runs this iteration, on which row, with which blocks.

Why this module exists: continuous batching means the batch changes shape every iteration. A
request leaves the moment it finishes and a waiting one takes its row on the very next iteration.
All of that happens in ``schedule()``, in one order that matters:

1. **release** the finished: their blocks go back to the pool, their slot to the free list, and
   ``on_release`` lets the engine reset the cache row; when every layer is windowed (Day 70) the
   running give back the blocks behind their windows too (``KVCacheManager.free_out_of_window``);
2. **grow** the running (Day 33): oldest first, each gets the blocks its next tokens need; when
   the pool is dry the youngest running request is *preempted* (blocks and slot back, generated
   tokens kept, head of the waiting queue) and later resumes by recomputing its K/V;
3. **compact** the running into rows 0..n-1 (Day 58, only with ``compact_rows=True``): each
   request above a hole moves into it through the engine's ``on_move`` (a relabel of the cache
   row, no K/V copied), so a recorded decode window can replay every step;
4. **admit** what fits, first come first served, never past a blocked head (looking past it
   raises utilisation today and starves large prompts forever).

Reversed, a slot freed this iteration would sit idle until the next one: correct output, one
wasted row per completion, and no correctness test would notice. Compaction sits after growth
because a preemption opens holes halfway through a batch, and before admission because filling a
hole with a newcomer would still leave the survivor above it out of place.

The same order spends the step's token budget (``max_num_batched_tokens``, Day 41): one token for
every running decode, then its proposals (Day 76), then the prompt tokens of running prefills and
newcomers, the last cut to what is left (``chunked_prefill``) or left waiting whole. A request's
``num_computed_tokens`` advances when its tokens are scheduled (a verify step takes back its
rejected proposals); it emits nothing until its last chunk. The budget is always a number:
unbounded (``math.inf``) for a bare scheduler, its config's for an engine's, its one rule
``config.engine.budget_problem``.

Admission needs a *slot* (a row of the batched cache, lowest free first) and *KV blocks*
(``blocked_on_slots`` and ``blocked_on_blocks`` count which ran out). The blocks come from the
scheduler's own ``KVCacheManager`` (prefix caching, Day 43, is its policy: the scheduler asks the
same questions either way), in the amounts ``blocks_needed_for`` says, the only allocation rule:
``"incremental"`` (Day 33) buys what the tokens occupy, a block at a time; ``"reserve"`` (Week 8)
books the worst case, prompt plus the whole remaining budget, up front, so an admitted request
never runs short and is never preempted, at the price of memory nobody writes. ``add`` runs the
door check (``KVCacheManager.check_fits``). Static waves (Day 29) are this machinery under
another policy (``waves.py``).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from nanoserve.config import ALLOCATION_POLICIES
from nanoserve.config.engine import budget_problem
from nanoserve.engine.compact import RowCompactor, RowMove
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request, RequestState
from nanoserve.engine.scheduler_output import Chunk, SchedulerOutput
from nanoserve.validation import InvalidRequest

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig


class Scheduler:
    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int,
                 allocation: str = "reserve",
                 on_release: Callable[[Request], None] | None = None,
                 compact_rows: bool = False,
                 on_move: Callable[[int, int], object] | None = None,
                 max_num_batched_tokens: int | None = None, chunked_prefill: bool = True):
        if allocation not in ALLOCATION_POLICIES:
            raise ValueError(f"allocation={allocation!r}; choose one of {ALLOCATION_POLICIES}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if why := budget_problem(max_num_batched_tokens, max_num_seqs):
            raise ValueError(why)
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        # Day 41: the tokens one step may compute, decodes first; unset, no step is capped
        # (whole prompts, admitted by slots and blocks alone) and nothing is chunked.
        self.max_num_batched_tokens = max_num_batched_tokens or math.inf
        self.chunked_prefill = chunked_prefill and max_num_batched_tokens is not None
        self.allocation = allocation
        self.on_release = on_release
        # Day 58: "free" leaves every request in its row; "persistent" keeps rows 0..n-1 full
        self.compact_rows = compact_rows
        self.compactor = RowCompactor("persistent" if compact_rows else "free", on_move)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_num_seqs))  # a heap: the lowest free row first
        self._aborted: list[Request] = []  # released by abort(), reported by the next schedule
        # counters: what happened, for tests, benchmarks and the book
        self.schedule_calls = 0
        self.admitted_total = 0
        self.finished_total = 0
        self.blocked_on_slots = 0  # admission stopped: batch full, pool fine
        self.blocked_on_blocks = 0  # admission stopped: pool dry
        self.blocked_on_budget = 0  # admission stopped: this step's tokens are spent (Day 41)
        self.preemptions = 0
        self.recomputed_tokens = 0  # tokens re-prefilled when preempted requests resume
        self._arrivals = 0

    @classmethod
    def from_config(cls, config: EngineConfig, kv_cache_manager: KVCacheManager,
                    max_model_len: int, **hooks) -> Scheduler:
        """The scheduler an engine config asks for (``hooks``: the engine's ``on_release`` and
        ``on_move``), its budget resolved against ``max_model_len``."""
        return cls(kv_cache_manager, config.max_num_seqs, allocation=config.allocation_policy,
                   compact_rows=config.persistent_batch,
                   max_num_batched_tokens=config.resolve_max_num_batched_tokens(max_model_len),
                   chunked_prefill=config.enable_chunked_prefill, **hooks)

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens of new requests looked up in the prefix cache (Day 44)."""
        return self.kv_cache_manager.prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        """... of which were found cached."""
        return self.kv_cache_manager.prefix_cache_hits

    # ------------------------------------------------------------------ requests in

    def add(self, request: Request) -> None:
        if request.state is not RequestState.WAITING:
            raise ValueError(f"request {request.request_id!r} is {request.state.value}, "
                             f"not waiting")
        self.kv_cache_manager.check_fits(request, f"request {request.request_id!r}")
        budget = self.max_num_batched_tokens
        if not self.chunked_prefill and request.worst_case_tokens > budget:
            raise InvalidRequest(f"request {request.request_id!r}: prompt + max_tokens = "
                                 f"{request.worst_case_tokens} tokens, past the step budget of "
                                 f"{budget} with chunked prefill off, so it could never be "
                                 f"scheduled whole", "max_tokens", request.worst_case_tokens)
        request.arrival = self._arrivals  # seniority: who is older, for victim choice
        self._arrivals += 1
        self.waiting.append(request)

    def abort(self, request: Request, reason: str = "abort") -> None:
        """Finish a waiting or running request now, its resources back; the next ``schedule()``
        reports it finished with ``reason`` ("abort", or "error": the engine failed its step)."""
        if request.state is RequestState.WAITING:
            self.waiting.remove(request)
            request.finish(reason)
        elif request.state is RequestState.RUNNING:
            if reason == "error":  # its step never wrote its K/V: nothing may find it
                self.kv_cache_manager.forget(request.blocks)
            request.finish(reason)
            self.running.remove(request)
            self._release(request)
        else:
            raise ValueError(f"request {request.request_id!r} is already finished")
        self._aborted.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unreported_aborts(self) -> int:  # aborted since the last schedule(), to report
        return len(self._aborted)

    # ------------------------------------------------------------------ one iteration

    def schedule(self) -> SchedulerOutput:
        """Release the finished, then grow the running, then compact them, then admit what
        fits. The order is the point: growth before admission means a newcomer never takes the
        block a running request needs for its next token, and compaction between the two sweeps
        the holes growth's preemptions opened without ever moving a newcomer. The token budget
        is spent in the same order: every running decode one token first, then running
        prefills first come first served, then newcomers; with chunked prefill the last prompt
        that does not fit is cut to what is left, without it it waits whole."""
        self.schedule_calls += 1
        out = SchedulerOutput(finished=self._release_finished())
        self._free_out_of_window()
        left = self.max_num_batched_tokens
        plan: dict[Request, int] = {}
        by_age = sorted(self.running, key=lambda r: r.arrival)
        for r in by_age:  # decodes: budget >= max_num_seqs, so every one of them fits
            if r.output_token_ids and r.num_tokens - r.num_computed_tokens == 1:
                plan[r] = 1
                left -= 1
        left -= self._plan_proposals(plan, by_age, left)
        for r in by_age:  # prefills in progress, oldest first
            n = min(r.num_tokens - r.num_computed_tokens, left)
            if r not in plan and n > 0:
                plan[r] = n
                left -= n
        out.preempted = self._grow_running(plan)
        out.moves = self._compact()
        for r in self.running:
            n = plan.get(r)
            if n is None:
                continue  # planned nothing: the budget ran out before it
            if r.output_token_ids and r.num_tokens - r.num_computed_tokens == 1:
                out.decode.append(r)  # with its proposals, if any: n == 1 + k
            else:
                out.chunks.append(Chunk(r, r.num_computed_tokens, n))
        out.mixed = self.chunked_prefill
        self._commit(out)
        admitted = self._admit(self.max_num_batched_tokens - out.num_batched_tokens)
        out.admitted = [c.request for c in admitted]
        out.chunks += admitted
        return self._commit_decodes(out)

    def _plan_proposals(self, plan: dict[Request, int], by_age: list[Request],
                        left: float) -> int:
        """Speculative decoding (Day 76): each decode's proposals, oldest first, cut to what
        the step's budget has left and to one fewer than the tokens it may still emit (so a
        verify step never writes past ``max_tokens`` or ``max_model_len``); a request that is
        not decoding this step drops its proposals. Returns the tokens planned."""
        spent = 0
        for r in (r for r in by_age if r.spec_token_ids):
            k = 0 if r not in plan else max(0, int(min(
                len(r.spec_token_ids), left - spent, r.max_tokens - len(r.output_token_ids) - 1)))
            r.spec_token_ids = r.spec_token_ids[:k]
            if r.spec_draft_probs is not None:
                r.spec_draft_probs = r.spec_draft_probs[:k] if k else None
            if k:
                plan[r] += k
                spent += k
        return spent

    def _free_out_of_window(self) -> None:
        """Every layer windowed (Day 70): before growth, each running request gives back the
        blocks its next queries cannot see, so growth and admission can use them this step."""
        for r in self.running:
            if not r.is_finished:
                self.kv_cache_manager.free_out_of_window(r)

    def _commit(self, out: SchedulerOutput) -> None:
        """The running's scheduled tokens count as computed; the blocks they fill are committed
        to the KV manager now (findable, with prefix caching), before admission, so a newcomer
        can share them. A decode's block waits for ``_commit_decodes`` unless the step is one
        forward (``mixed``): with two, the prefill runs first and would read the decode's last
        cell before it is written."""
        for c in out.chunks:
            c.request.num_computed_tokens = c.start + c.n
        for r in out.decode:  # its last token's K/V lands this step, and its proposals'
            r.num_computed_tokens = r.num_tokens + len(r.spec_token_ids)
        for r in out.scheduled if out.mixed else [c.request for c in out.chunks]:
            self.kv_cache_manager.commit(r)

    def _commit_decodes(self, out: SchedulerOutput) -> SchedulerOutput:
        """Two forwards (no chunking): commit the decodes' blocks after admission."""
        for r in out.decode if not out.mixed else ():
            self.kv_cache_manager.commit(r)
        return out

    def blocks_needed_for(self, request: Request, upto: int | None = None) -> int:
        """The only allocation rule: blocks to add before this request's next forward.

        ``reserve`` (Week 8): the worst case, all at admission; 0 afterwards.
        ``incremental`` (Day 33): what its tokens occupy. A fresh request needs its prompt's
        blocks; a running one 0, or 1 on the step that crosses a block boundary; a preempted
        one coming back needs its prompt plus everything it generated. ``upto``: the tokens
        cached once this step is done, when a budget cuts a prefill short (Day 41).
        """
        target = (request.worst_case_tokens if self.allocation == "reserve"
                  else request.num_tokens if upto is None else upto)
        return max(0, self.kv_cache_manager.blocks_for_length(target) - len(request.blocks))

    def _grow_running(self, plan: dict[Request, int] | None = None) -> list[Request]:
        """Oldest first, give each running request the blocks its planned tokens need (all it
        has not computed, by default), taking them from the youngest running request when the
        pool is dry. The oldest is never a victim, so it always finishes and the pool always
        drains. A victim leaves the plan."""
        if plan is None:
            plan = {r: r.num_tokens - r.num_computed_tokens for r in self.running}
        preempted: list[Request] = []
        kv = self.kv_cache_manager
        for r in sorted(self.running, key=lambda r: r.arrival):
            if r.state is not RequestState.RUNNING or r not in plan:
                continue  # preempted earlier in this pass, or no tokens this step
            need = self.blocks_needed_for(r, r.num_computed_tokens + plan[r])
            while need > kv.num_free:
                victim = max(self.running, key=lambda v: v.arrival)  # the youngest
                self._preempt(victim)
                preempted.append(victim)
                plan.pop(victim, None)
                if victim is r:  # nobody younger to evict: its own victim
                    break
            if r.state is RequestState.RUNNING and need:
                r.blocks += kv.allocate(need)
        return preempted

    def _compact(self) -> list[RowMove]:
        """Move the running requests into rows 0..n-1 (a no-op in "free" mode). The engine's
        ``on_move`` relabels the cache row first and may refuse; only then does the request
        take its new slot, and the row it left goes back on the free heap."""
        if not self.running:
            return []
        by_row = {r.slot: r for r in self.running}

        def relabel(move: RowMove) -> None:
            if move.dst not in self._free_slots:
                raise ValueError(f"move {move}: row {move.dst} is not free")
            r = by_row.pop(move.src)
            self._free_slots.remove(move.dst)
            heapq.heapify(self._free_slots)
            heapq.heappush(self._free_slots, move.src)
            r.slot = move.dst
            by_row[move.dst] = r

        return self.compactor.compact([r.slot for r in self.running], relabel,
                                      self.max_num_seqs)

    def _preempt(self, victim: Request) -> None:
        """Preemption by recompute: blocks and slot back, tokens kept, head of the queue."""
        self.running.remove(victim)
        self._return_resources(victim)
        victim.transition(RequestState.WAITING)
        victim.num_computed_tokens = victim.num_cached_blocks = 0  # its K/V left with its blocks
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _return_resources(self, request: Request) -> None:
        if self.on_release is not None:  # the engine resets the row while the slot moves
            self.on_release(request)
        self.kv_cache_manager.free(request.blocks)
        request.blocks, request.num_null_blocks = [], 0
        heapq.heappush(self._free_slots, request.slot)
        request.slot = None

    def _release(self, request: Request) -> None:
        self._return_resources(request)
        self.finished_total += 1

    def release_finished(self) -> list[Request]:
        """``schedule()``'s first move (the finished and aborted give back blocks and slots),
        for an engine that stops and so runs no next step; returns them."""
        return self._release_finished()

    def _release_finished(self) -> list[Request]:  # a policy may hold the finished longer
        done, self._aborted = self._aborted, []
        for r in [r for r in self.running if r.is_finished]:
            self.running.remove(r)
            self._release(r)
            done.append(r)
        return done

    def _admit(self, left: float = math.inf) -> list[Chunk]:
        """First come first served, never past a blocked head; each admitted with the prompt
        tokens it computes this step (``left``: what remains of the step's budget), counted as
        computed and committed to the KV manager at once, so the next newcomer of this step can
        hit them."""
        admitted, kv = [], self.kv_cache_manager
        while self.waiting:
            head = self.waiting[0]
            if not self._free_slots:
                self.blocked_on_slots += 1
                break
            hit = kv.find_prefix(head)
            start = len(hit) * kv.block_size  # a prefix hit is computed already
            n = min(head.num_tokens - start, left) if self.chunked_prefill else \
                head.num_tokens - start
            if n < 1 or n > left:
                self.blocked_on_budget += 1
                break
            need = self.blocks_needed_for(head, start + n) - len(hit)
            if not kv.can_allocate(need, hit):
                self.blocked_on_blocks += 1
                break  # FIFO: never look past a blocked head
            self.waiting.popleft()
            if head.num_preemptions:  # resuming: its history is prefilled again, bar hits
                self.recomputed_tokens += head.num_tokens - start
            head.blocks = kv.admit(head, hit, need)
            head.num_computed_tokens, head.num_cached_blocks = start + n, len(hit)
            kv.commit(head)
            head.slot = heapq.heappop(self._free_slots)
            head.transition(RequestState.RUNNING)
            self.running.append(head)
            admitted.append(Chunk(head, start, n))
            left -= n
        self.admitted_total += len(admitted)
        return admitted

    # ------------------------------------------------------------------ what it costs

    def fragmentation_waste(self) -> float:
        """``KVCacheManager.fragmentation_waste`` of the running requests."""
        return self.kv_cache_manager.fragmentation_waste(self.running)

    def reservation_waste(self) -> float:
        """``KVCacheManager.reservation_waste`` of the running requests."""
        return self.kv_cache_manager.reservation_waste(self.running)

    def check_invariants(self) -> None:
        """Each block free or held (by one running request, or shared by prefix-cache hits)."""
        kv = self.kv_cache_manager
        kv.check_invariants()
        held = Counter(b for r in self.running for b in r.blocks[r.num_null_blocks:])
        assert len(held) == kv.num_held, "blocks out of balance"
        assert kv.pool.caching or set(held.values()) <= {1}, "two requests hold one block"
        slots = [r.slot for r in self.running]
        assert len(set(slots)) == len(slots), "two running requests share a slot"
        assert sorted(slots + self._free_slots) == list(range(self.max_num_seqs)), "slot lost"
        # running holds RUNNING requests, and FINISHED ones until the next schedule releases them
        assert all(r.state is not RequestState.WAITING for r in self.running)
        assert all(r.state is RequestState.WAITING for r in self.waiting)
