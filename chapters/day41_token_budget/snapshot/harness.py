"""Day 41 snapshot (frozen): a budgeted schedule, step by step, without a model.

Why this module exists: whether a budget is spent in the right order is a question about
bookkeeping, so it can be answered exactly with integer tokens. ``trace`` drives any scheduler
of this shape (``add``, ``abort``, ``schedule``, ``has_unfinished``) and writes down, for every
``schedule()`` call that did some work, what it scheduled: each prompt chunk as
``(request id, start, n)``, the decodes, who was given a token, who was preempted and who was
released. The engine's half of a step is one line: every request in ``out.sampled`` gets a token.

Arrivals and aborts are keyed by step number (1-based): the requests of ``arrivals[s]`` are
added, and those of ``aborts[s]`` aborted, just before the ``s``-th ``schedule()``. A scheduler
from before the budget (Day 33: ``admitted`` and ``decode``, no chunks) is read as if each
admitted request were one chunk of its whole sequence, so old and new can be compared.

>>> from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
>>> from chapters.day41_token_budget.snapshot.scheduler import Request, Scheduler
>>> s = Scheduler(BlockAllocator(16, 4), 2, "incremental", max_num_batched_tokens=4)
>>> steps = trace(s, {1: [Request("a", [1] * 6, max_tokens=2)]})
>>> [(st.chunks, st.decode, st.tokens) for st in steps]
[([('a', 0, 4)], [], 4), ([('a', 4, 2)], [], 2), ([], ['a'], 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

TOKEN = 1  # every generated token: the schedule never looks at values


@dataclass(frozen=True, slots=True)
class Step:
    chunks: list[tuple]  # (request id, start, n): prompt tokens computed this step
    decode: list  # request ids that decode one token
    sampled: list  # request ids given a token by this step
    preempted: list  # sent back to the waiting queue by this call
    finished: list  # released by this call (finished in the step before, or aborted)
    tokens: int  # tokens the step computes: what the budget caps
    held: int  # blocks held once the call is done

    @property
    def decode_tokens(self) -> int:
        return len(self.decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, _, n in self.chunks)


def _read(out) -> tuple[list[tuple], list]:
    """(chunks as tuples, the requests given a token) from either kind of output."""
    chunks = getattr(out, "chunks", None)
    if chunks is None:  # before the budget: an admission prefills everything it holds
        return [(r.request_id, 0, r.num_tokens) for r in out.admitted], out.admitted + out.decode
    return [(c.request.request_id, c.start, c.n) for c in chunks], out.sampled


def trace(sched, arrivals: dict[int, list], aborts: dict[int, list] | None = None,
          max_steps: int = 100_000) -> list[Step]:
    """Every working ``schedule()`` call, in order; the pool must drain at the end."""
    aborts = aborts or {}
    last = max([*arrivals, *aborts, 0])
    steps: list[Step] = []
    for s in range(1, max_steps + 1):
        for r in arrivals.get(s, []):
            sched.add(r)
        for r in aborts.get(s, []):
            if not r.is_finished:
                sched.abort(r)
        out = sched.schedule()
        if out.num_scheduled == 0 and s > last and not sched.has_unfinished():
            break  # this call only handed back the last answers
        chunks, sampled = _read(out)
        for r in sampled:
            r.append_token(TOKEN)
        decode = [r.request_id for r in out.decode]
        steps.append(Step(chunks, decode, [r.request_id for r in sampled],
                          [r.request_id for r in out.preempted],
                          [r.request_id for r in out.finished],
                          sum(n for _, _, n in chunks) + len(decode),
                          sched.allocator.num_held))
        sched.check_invariants()
    else:
        raise RuntimeError(f"no drain after {max_steps} steps: a request can never be scheduled")
    assert sched.allocator.num_free == sched.allocator.num_blocks, "a block leaked"
    return steps
