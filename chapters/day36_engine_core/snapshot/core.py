"""Day 36 snapshot (frozen): the engine core, one scheduler for the engine's whole life.

Before today a batch of prompts built a scheduler, ran to the end and threw it away. A server
needs the opposite: a core that lives as long as the engine, takes requests between iterations,
drops them when a client leaves, and reports every request's news after each iteration. So the
core is driven from outside, one call at a time::

    core = EngineCore(model, num_blocks=16, block_size=4, max_num_seqs=4)
    core.add_request("a", [5, 6, 7], max_tokens=3)
    while core.has_unfinished():
        for d in core.step():      # RequestDelta: the tokens and text "a" gained this step
            ...
    core.check_drained()           # every block and slot is back

Text is handed out so that the deltas, joined, are exactly the final text. A stop string is cut
out of the final text, so while a request with stop strings runs, its last
``len(longest stop) - 1`` characters are held back: they could be the start of a stop string.
A forward that raises ends only the requests of that step (``finish_reason="error"``, blocks
back at once); the core lives on.

Greedy decoding only (argmax), over the earlier days' snapshots: Day 33's scheduler and requests
with incremental allocation and preemption, Day 17's paged cache, Day 27's padded forward.
``detokenizer``, if given, is a factory ``prompt_ids -> object`` with ``push(token) -> str`` and
``text``; the core never needs to know which tokenizer is behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import forward_rows
from chapters.day33_preemption.snapshot.request import Request, RequestState
from chapters.day33_preemption.snapshot.scheduler import Scheduler


@dataclass(slots=True)
class RequestDelta:
    """One request's news from one step: what its consumer has not seen yet."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    num_output_tokens: int  # cumulative
    error: str | None = None


@dataclass(slots=True)
class _Tracked:
    request: Request
    sent_tokens: int = 0
    sent_chars: int = 0
    hold_back: int = 0  # characters a stop string could still claim
    error: str | None = None


class EngineCore:
    def __init__(self, model: Llama, num_blocks: int, block_size: int, max_num_seqs: int,
                 detokenizer: Callable[[list[int]], object] | None = None,
                 eos_token_ids: frozenset[int] = frozenset()):
        self.model = model
        self.pool = BlockAllocator(num_blocks, block_size)
        self.cache = BatchedPagedKVCache.for_model(model, num_blocks, block_size, max_num_seqs,
                                                   model.cfg.max_position_embeddings)
        self.scheduler = Scheduler(self.pool, max_num_seqs, allocation="incremental",
                                   on_release=lambda r: self.cache.reset_row(r.slot))
        self.detokenizer = detokenizer
        self.eos_token_ids = eos_token_ids
        self.live: dict[str, _Tracked] = {}  # added and not yet reported finished
        # counters for the engine's whole life
        self.iterations = self.forward_passes = self.row_steps = self.deltas = 0

    # ------------------------------------------------------------------ requests in

    def make_request(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                     stop: tuple[str, ...] = (), ignore_eos: bool = True) -> Request:
        """Check and build a request without queueing it (a caller on another thread checks
        at its own door, then hands the request over)."""
        if not isinstance(request_id, str):
            raise ValueError(f"request ids are strings, got {type(request_id).__name__}")
        if request_id in self.live:
            raise ValueError(f"request id {request_id!r} is already live")
        detok = self.detokenizer(list(prompt_token_ids)) if self.detokenizer else None
        return Request(request_id, prompt_token_ids, max_tokens, stop=tuple(stop),
                       eos_token_ids=frozenset() if ignore_eos else self.eos_token_ids,
                       detokenizer=detok)

    def add(self, request: Request) -> None:
        if request.request_id in self.live:
            raise ValueError(f"request id {request.request_id!r} is already live")
        self.scheduler.add(request)  # Day 33's door check: a request that could never fit
        hold = max((len(s) for s in request.stop), default=1) - 1
        self.live[request.request_id] = _Tracked(request, hold_back=hold)

    def add_request(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                    stop: tuple[str, ...] = (), ignore_eos: bool = True) -> Request:
        r = self.make_request(request_id, prompt_token_ids, max_tokens, stop, ignore_eos)
        self.add(r)
        return r

    def abort_request(self, request_id: str) -> bool:
        """Finish a live request now, blocks back before this returns; False if unknown or
        already finished. The next step reports it."""
        t = self.live.get(request_id)
        if t is None or t.request.is_finished:
            return False
        self.scheduler.abort(t.request)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.live)

    # ------------------------------------------------------------------ one iteration

    def _forward(self, group: list[Request], tokens: list[list[int]]) -> torch.Tensor:
        for r in group:  # BlockTable.extend: the row learns the blocks its request holds
            table = self.cache.tables[r.slot]
            table.extend(r.blocks[len(table):])
        self.forward_passes += 1
        self.row_steps += len(group)
        return forward_rows(self.model, self.cache, [r.slot for r in group], tokens)  # (B, V)

    def step(self) -> list[RequestDelta]:
        """Schedule, run the model once (a prefill and a decode may share the step), report."""
        out = self.scheduler.schedule()
        scheduled = out.admitted + out.decode
        if not scheduled:
            if self.scheduler.has_unfinished():
                raise RuntimeError("the scheduler made no progress with requests waiting")
            return self._deltas(out.finished)
        self.iterations += 1
        try:
            for group, tokens in ((out.admitted, [r.token_ids for r in out.admitted]),
                                  (out.decode, [[r.output_token_ids[-1]] for r in out.decode])):
                if group:
                    logits = self._forward(group, tokens)
                    for r, tok in zip(group, logits.argmax(-1).tolist(), strict=True):
                        r.append_token(tok)
        except Exception as e:  # noqa: BLE001 - this step's requests fail, the core lives on
            for r in scheduled:
                if r.state is RequestState.RUNNING:
                    self.scheduler.abort(r)
                    r.finish_reason = "error"
                    self.live[r.request_id].error = f"{type(e).__name__}: {e}"
        return self._deltas(out.finished + scheduled)

    def _deltas(self, requests: list[Request]) -> list[RequestDelta]:
        deltas = []
        for r in requests:
            t = self.live.get(r.request_id)
            if t is None or t.request is not r:
                continue  # reported finished already, or an older request with the same id
            done = r.is_finished
            if r.detokenizer is None:
                visible = ""
            elif done:
                visible = r.text  # cut before any stop string
            else:
                text = r.detokenizer.text
                visible = text[:max(t.sent_chars, len(text) - t.hold_back)]
            d = RequestDelta(r.request_id, r.output_token_ids[t.sent_tokens:],
                             visible[t.sent_chars:], done, r.finish_reason if done else None,
                             len(r.output_token_ids), t.error if done else None)
            t.sent_tokens, t.sent_chars = len(r.output_token_ids), max(t.sent_chars,
                                                                        len(visible))
            if d.new_token_ids or d.new_text or done:
                deltas.append(d)
            if done:
                del self.live[r.request_id]
        self.deltas += len(deltas)
        return deltas

    # ------------------------------------------------------------------ after a drain

    def check_drained(self) -> None:
        """Every block back in the pool, every slot free, every cache row empty."""
        self.pool.check_invariants()
        assert not self.has_unfinished(), "requests are still in the core"
        assert self.pool.num_free == self.pool.num_blocks, (
            f"a KV block leaked: {self.pool.num_held} of {self.pool.num_blocks} held")
        self.scheduler.check_invariants()
        assert all(len(t) == 0 for t in self.cache.tables), "a cache row kept blocks"
