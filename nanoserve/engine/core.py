"""The engine core: one long-lived scheduler, a request table, and one iteration at a time.

Why this module exists: until Day 36 every ``LLM.generate`` call built a scheduler, ran its
prompts to the end and threw the scheduler away. A server cannot work like that. Requests arrive
while others run, leave when their client hangs up, and want their tokens as they come. So the
engine gets a life of its own: ``EngineCore`` owns the ``Engine`` and one ``Scheduler`` for as
long as it lives, and it is driven from outside, one iteration per ``step()``:

- ``add_request(request_id, prompt_token_ids, params)`` checks a request and queues it; a bad
  request is an ``InvalidRequest`` (a ``ValueError`` naming the field) and changes nothing; a
  live duplicate id is one too.
- ``abort_request(request_id)`` finishes it now: its blocks and slot go back at once, and the next
  ``step()`` reports it with ``finish_reason="abort"``.
- ``step()`` runs one scheduler iteration and one engine step, and returns a ``RequestDelta`` for
  every request that produced news: the tokens and text it gained, and whether it is done.
- ``has_unfinished()`` says whether another ``step()`` has work (finished requests still count
  until the step that releases their blocks).

``LLM.generate`` is "add all, step until done" over this object, and the async engine is a thread
that calls ``step()`` while requests exist. Nothing here knows about HTTP or asyncio.

Streaming text has one subtlety. A stop string is cut out of the final text, so a delta must not
hand out characters that a stop string may later claim: while a request with stop strings runs,
the last ``len(longest stop) - 1`` characters are held back, as vLLM does, and released when the
request finishes. The concatenated deltas therefore always equal the final text.

``EngineCore.from_config(EngineConfig(...))`` loads a checkpoint and builds the core over it.
What the server and the metrics read about it is one ``snapshot()``: a frozen ``CoreSnapshot`` of
the requests running and waiting, the pool, the counters and how decode steps ran, so nothing
above the core reaches into the engine, the scheduler or the allocator.

>>> from nanoserve.config import EngineConfig
>>> core = EngineCore.from_config(EngineConfig(dtype="float32", max_num_seqs=2, block_size=4))
>>> r = core.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0))
>>> [(d.request_id, len(d.new_token_ids), d.finished) for d in core.step()]  # the prefill
[('a', 1, False)]
>>> core.snapshot().num_running, core.snapshot().num_free_blocks < core.snapshot().num_blocks
(1, True)
>>> while core.has_unfinished():
...     _ = core.step()
>>> snap = core.snapshot()
>>> snap.num_running, snap.num_free_blocks == snap.num_blocks, snap.requests_finished
(0, True, 1)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from nanoserve.engine.engine import Engine, EngineBroken
from nanoserve.engine.request import Request, RequestMetrics, RequestState
from nanoserve.engine.scheduler import Scheduler
from nanoserve.sampling.params import SamplingParams
from nanoserve.tokenizer import IncrementalDetokenizer, Tokenizer
from nanoserve.validation import InvalidRequest, check_prompt_ids, door_check

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig
    from nanoserve.loader import LoadedEngine


@dataclass(slots=True)
class RequestDelta:
    """One request's news from one iteration: what its consumer has not seen yet."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list  # TokenLogprob per new token when params.logprobs is set, else []
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    error: str | None = None  # what went wrong, when finish_reason == "error"


@dataclass(slots=True)
class _Tracked:
    """What the core has already handed out for one request."""

    request: Request
    sent_tokens: int = 0
    sent_chars: int = 0
    hold_back: int = 0  # characters a stop string could still claim
    error: str | None = None


@dataclass(slots=True)
class CoreCounters:
    """Cumulative, for the engine's whole life: what metrics and ``LLM.stats`` read."""

    iterations: int = 0  # steps that ran the model
    requests_added: int = 0
    requests_finished: int = 0
    requests_failed: int = 0  # finished with "error": a forward raised in their step
    by_reason: dict = field(default_factory=dict)  # finish_reason -> count


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """What the core holds and has done, read at one moment; a copy, never a handle."""

    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    block_size: int
    num_preemptions: int
    iterations: int
    requests_added: int
    requests_finished: int
    requests_failed: int
    by_reason: MappingProxyType  # finish_reason -> count
    decode_steps: int
    decode_steps_replayed: int  # ... that replayed a recorded window (Day 57)
    decode_steps_scattered: int  # ... that ran the eager forward
    decode_windows: str | None  # "cuda graphs over buckets [...]" or None
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache (Day 44)
    prefix_cache_hits: int  # ... found there
    prefix_cache_evictions: int  # cached blocks given up for new K/V

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the pool's blocks held by requests, 0 to 1 (vLLM's kv_cache_usage)."""
        return 1 - self.num_free_blocks / self.num_blocks


class EngineCore:
    loaded: LoadedEngine | None = None  # set by from_config: the model, tokenizer, dtype, ...

    def __init__(self, engine: Engine, tokenizer: Tokenizer | None,
                 eos_token_ids: frozenset[int], max_model_len: int, vocab_size: int,
                 max_num_seqs: int, allocation: str = "incremental",
                 compact_rows: bool = False, max_num_batched_tokens: int | None = None,
                 chunked_prefill: bool = True):
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.scheduler = Scheduler(engine.allocator, max_num_seqs, allocation=allocation,
                                   on_release=engine.release_row, compact_rows=compact_rows,
                                   on_move=engine.move_row,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   chunked_prefill=chunked_prefill)
        self.requests: dict[str, _Tracked] = {}  # live: added and not yet reported finished
        self.driver: str | None = None  # who steps this core; a second driver is refused
        self.counters = CoreCounters()
        self._grammars = None  # structured outputs' backend, made on first use
        self._grammars_lock = threading.Lock()

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        """Load what ``config`` names and build the core over it (``loader.load_engine``)."""
        from nanoserve.loader import load_engine

        loaded = load_engine(config)
        core = cls(loaded.engine, loaded.tokenizer, loaded.eos_token_ids, loaded.max_model_len,
                   loaded.model_config.vocab_size, config.max_num_seqs, config.allocation,
                   compact_rows=config.persistent_batch,
                   max_num_batched_tokens=config.resolve_max_num_batched_tokens(
                       loaded.max_model_len),
                   chunked_prefill=config.enable_chunked_prefill)
        core.loaded = loaded
        return core

    # ------------------------------------------------------------------ requests in

    def make_request(self, request_id: str, prompt_token_ids: list[int],
                     params: SamplingParams, who: str | None = None) -> Request:
        """Check one request and build it, changing nothing: ``LLM`` checks a whole batch
        before any of it starts. ``who`` names the request in error messages."""
        who = who or f"request {request_id!r}"
        if not isinstance(request_id, str):
            raise InvalidRequest(f"{who}: request ids are strings, got "
                                 f"{type(request_id).__name__}", "request_id", request_id)
        if request_id in self.requests:
            raise InvalidRequest(f"{who}: request id {request_id!r} is already live",
                                 "request_id", request_id)
        ids = [int(t) for t in prompt_token_ids]
        check_prompt_ids(ids, self.vocab_size, self.max_model_len, "prompt", who)
        params.check_vocab(self.vocab_size)
        budget = self.max_model_len - len(ids)
        if params.max_tokens is not None:
            budget = min(budget, params.max_tokens)
        detok = (IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
                 if self.tokenizer is not None else None)
        device = self.engine.device
        r = Request(request_id, ids, max_tokens=budget,
                    eos_token_ids=frozenset() if params.ignore_eos else self.eos_token_ids,
                    stop_token_ids=frozenset(params.stop_token_ids), stop=tuple(params.stop),
                    detokenizer=detok, generator=params.make_generator(device), params=params)
        if params.structured_outputs is not None:
            r.matcher = self.grammars().matcher(params.structured_outputs)
        r.metrics = RequestMetrics(time.perf_counter())
        door_check(self.engine.allocator, r, who)
        return r

    def grammars(self):
        """The structured-outputs backend (Day 67), built at the first constrained request."""
        with self._grammars_lock:  # the server's worker thread and the event loop may race
            return self._make_grammars()

    def _make_grammars(self):
        if self._grammars is None:
            if self.tokenizer is None:
                raise InvalidRequest("structured_outputs needs the tokenizer; this engine was "
                                     "built with skip_tokenizer_init=True", "structured_outputs")
            from nanoserve.structured.backend import GrammarBackend

            self._grammars = GrammarBackend.for_tokenizer(self.tokenizer, self.vocab_size,
                                                          self.eos_token_ids)
        return self._grammars

    def add(self, request: Request) -> None:
        """Queue a request built by ``make_request``."""
        if request.request_id in self.requests:
            raise InvalidRequest(f"request id {request.request_id!r} is already live",
                                 "request_id", request.request_id)
        self.scheduler.add(request)
        hold = max((len(s) for s in request.stop), default=1) - 1
        self.requests[request.request_id] = _Tracked(request, hold_back=hold)
        self.counters.requests_added += 1

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> Request:
        request = self.make_request(request_id, prompt_token_ids, params)
        self.add(request)
        return request

    def abort_request(self, request_id: str) -> bool:
        """Finish a live request now; its blocks are back before this returns. False if the
        id is unknown or the request already finished (a client may hang up late)."""
        t = self.requests.get(request_id)
        if t is None or t.request.is_finished:
            return False
        self.scheduler.abort(t.request)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.scheduler.num_unreported_aborts > 0

    # ------------------------------------------------------------------ one iteration

    def step(self) -> list[RequestDelta]:
        """Schedule, run the model once, and report every request's news."""
        out = self.scheduler.schedule()
        now = time.perf_counter()
        for r in out.finished:
            r.metrics.finished_time = now
        scheduled = out.scheduled
        if not scheduled:
            if self.scheduler.has_unfinished():
                raise RuntimeError("the scheduler made no progress with requests waiting")
            return self._deltas(out.finished)
        self.counters.iterations += 1
        try:
            finished = self.engine.step(out)
        except EngineBroken as e:  # no later step can run: fail these, and say so upward
            self._fail(scheduled, e)
            raise
        except Exception as e:  # noqa: BLE001 - the step's requests fail, the engine lives on
            return self._deltas(out.finished) + self._fail(scheduled, e)
        for r in finished:
            r.finish_iteration = self.counters.iterations
        return self._deltas(out.finished + scheduled)

    def _fail(self, requests: list[Request], error: Exception) -> list[RequestDelta]:
        """A forward raised: every request of that step that was still running ends with
        "error", its blocks and slot back at once; one that had already finished is reported
        as it finished."""
        message = f"{type(error).__name__}: {error}"
        now = time.perf_counter()
        for r in requests:
            if r.state is RequestState.RUNNING:
                self.scheduler.abort(r, reason="error")
                r.metrics.finished_time = now
                self.requests[r.request_id].error = message
                self.counters.requests_failed += 1
        return self._deltas(requests)

    def _deltas(self, requests: list[Request]) -> list[RequestDelta]:
        deltas, seen = [], set()
        for r in requests:
            t = self.requests.get(r.request_id)
            if t is None or r.request_id in seen or t.request is not r:
                continue
            seen.add(r.request_id)
            d = self._delta(t)
            if d.new_token_ids or d.new_text or d.finished:
                deltas.append(d)
            if d.finished:
                del self.requests[r.request_id]
                self.counters.requests_finished += 1
                reason = d.finish_reason
                self.counters.by_reason[reason] = self.counters.by_reason.get(reason, 0) + 1
        return deltas

    def _delta(self, t: _Tracked) -> RequestDelta:
        r = t.request
        done = r.is_finished
        new_ids = r.output_token_ids[t.sent_tokens:]
        logprobs = getattr(r, "logprobs", None) or []
        new_lp = list(logprobs[t.sent_tokens:t.sent_tokens + len(new_ids)])
        if r.detokenizer is None:
            visible = ""
        elif done:
            visible = r.text
        else:
            text = r.detokenizer.text
            visible = text[:max(t.sent_chars, len(text) - t.hold_back)]
        new_text = visible[t.sent_chars:]
        t.sent_tokens += len(new_ids)
        t.sent_chars = max(t.sent_chars, len(visible))
        return RequestDelta(r.request_id, list(new_ids), new_text, new_lp, done,
                            r.finish_reason if done else None, r.stop_reason if done else None,
                            len(r.prompt_token_ids), len(r.output_token_ids),
                            t.error if done else None)

    # ------------------------------------------------------------------ what it holds

    @property
    def num_running(self) -> int:
        return sum(1 for r in self.scheduler.running if not r.is_finished)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the pool's blocks held by requests, 0 to 1 (vLLM's kv_cache_usage)."""
        pool = self.engine.allocator
        return 1 - pool.num_free / pool.num_blocks

    def snapshot(self) -> CoreSnapshot:
        pool, sched, e = self.engine.allocator, self.scheduler, self.engine
        rc, graphs = e.replay_counters, e.graphs
        c = self.counters
        windows = None if graphs is None else f"{graphs.mode} over buckets {graphs.sizes}"
        return CoreSnapshot(self.num_running, self.num_waiting, pool.num_blocks, pool.num_free,
                            pool.block_size, sched.preemptions, c.iterations, c.requests_added,
                            c.requests_finished, c.requests_failed,
                            MappingProxyType(dict(c.by_reason)), rc.decode_steps, rc.replayed,
                            rc.scattered, windows, sched.prefix_cache_queries,
                            sched.prefix_cache_hits, pool.evictions)

    def check_drained(self) -> None:
        """After a drain every block is back in the pool and every slot is free."""
        pool = self.engine.allocator
        pool.check_invariants()
        assert not self.scheduler.has_unfinished(), "requests are still in the scheduler"
        assert pool.num_free == pool.num_blocks, (
            f"a KV block leaked: {pool.num_blocks - pool.num_free} of {pool.num_blocks} held")
        self.scheduler.check_invariants()  # every slot is free again
        assert all(len(t) == 0 for t in self.engine.cache.tables), "a cache row kept blocks"

    def run_to_completion(self, each_iteration=None) -> None:
        """Step until nothing is left. ``each_iteration(scheduler, n)``, if given, runs before
        every step (the stress test aborts requests and checks invariants there)."""
        if self.driver is not None:
            raise RuntimeError(f"this engine core is driven by {self.driver}; submit requests "
                               f"there instead of stepping it from a second thread")
        n = 0
        with torch.inference_mode():
            while self.has_unfinished():
                if each_iteration is not None:
                    each_iteration(self.scheduler, n)
                n += 1
                self.step()

