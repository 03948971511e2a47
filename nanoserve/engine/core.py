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

The core owns its scheduler, built from the engine's config (``batching`` picks the policy:
continuous, or Day 29's static waves), and the scheduler owns its ``KVCacheManager``.
``nanoserve.loader.load_core(EngineConfig(...))`` loads a checkpoint and builds a core over it.
What the front doors and the metrics read about it is one ``snapshot()``: a frozen
``CoreSnapshot`` of the requests running and waiting, the pool, the counters and how decode steps
ran, so nothing above the core reaches into the engine, the scheduler or the KV manager.

>>> from nanoserve.config import EngineConfig
>>> from nanoserve.loader import load_core
>>> core = load_core(EngineConfig(dtype="float32", max_num_seqs=2, block_size=4))
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
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from nanoserve.config.registries import BATCHING_POLICIES, load_class
from nanoserve.engine.engine import Engine, EngineBroken
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.outputs import CoreCounters, CoreSnapshot, RequestDelta
from nanoserve.engine.request import Request, RequestMetrics, RequestState
from nanoserve.engine.scheduler import Scheduler
from nanoserve.sampling.params import SamplingParams
from nanoserve.tokenizer import IncrementalDetokenizer, Tokenizer
from nanoserve.validation import InvalidRequest, check_prompt_ids

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig
    from nanoserve.spec_decode.proposer import Proposer


@dataclass(slots=True)
class _Tracked:
    """What the core has already handed out for one request."""

    request: Request
    sent_tokens: int = 0
    sent_chars: int = 0
    hold_back: int = 0  # characters a stop string could still claim
    sent_prompt_logprobs: bool = False
    error: str | None = None


class EngineCore:
    loaded = None  # what ``nanoserve.loader.load_core`` loaded: model, tokenizer, dtype, ...

    def __init__(self, engine: Engine, config: EngineConfig, tokenizer: Tokenizer | None,
                 eos_token_ids: frozenset[int], max_model_len: int, vocab_size: int,
                 proposer: Proposer | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        if (config.block_size, config.max_num_seqs) != (engine.cache.block_size,
                                                        len(engine.cache.tables)):
            raise ValueError(f"the config's blocks of {config.block_size} tokens and "
                             f"{config.max_num_seqs} rows are not the engine cache's "
                             f"({engine.cache.block_size}, {len(engine.cache.tables)})")
        kv = KVCacheManager.from_config(config, engine.num_kv_blocks,  # the engine's pool
                                        engine.cache.windows)
        policy = load_class(BATCHING_POLICIES[config.batching])  # a Scheduler, or one of its kind
        self.scheduler: Scheduler = policy.from_config(
            config, kv, max_model_len, on_release=engine.release_row, on_move=engine.move_row)
        engine.share_pool(kv)  # rows granted by hand between steps share the scheduler's pool
        self.requests: dict[str, _Tracked] = {}  # live: added and not yet reported finished
        self.driver: str | None = None  # who steps this core; a second driver is refused
        self.counters = CoreCounters()
        self._grammars = None  # structured outputs' backend, made on first use
        self._grammars_lock = threading.Lock()
        self.proposer = proposer  # speculative decoding (Day 76): None, or who proposes

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
        self.scheduler.kv_cache_manager.check_fits(r, who)
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
        if self.engine.hand_rows:  # refused before anything is scheduled: nobody's step fails
            raise RuntimeError(f"rows {sorted(self.engine.hand_rows)} were granted by hand and "
                               f"not released: hand-granted and scheduled rows never meet in "
                               f"one step")
        out = self.scheduler.schedule()
        self._release_proposals(out.finished + out.preempted)
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
        if self.proposer is not None:
            self._propose()
        return self._deltas(out.finished + scheduled)

    def _propose(self) -> None:
        """Speculative decoding (Day 76): every running request whose newest token is sampled
        and not yet computed gets proposals for the next step to verify."""
        decoding = [r for r in self.scheduler.running if r.state is RequestState.RUNNING
                    and r.output_token_ids and r.num_tokens - r.num_computed_tokens == 1]
        if decoding:
            self.proposer.propose(decoding)

    def _release_proposals(self, requests: list[Request]) -> None:
        """Requests that left the running batch (finished, aborted, failed, preempted): their
        proposals go, and the proposer forgets them (a draft model's per-request state)."""
        if self.proposer is None:
            return
        for r in requests:
            r.spec_token_ids, r.spec_draft_probs = [], None
            self.proposer.release(r)

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
        prompt_lp = None
        if (r.params is not None and r.params.prompt_logprobs is not None
                and not t.sent_prompt_logprobs and r.output_token_ids):
            t.sent_prompt_logprobs = True
            prompt_lp = [None, *r.prompt_logprobs]
        return RequestDelta(r.request_id, list(new_ids), new_text, new_lp, done,
                            r.finish_reason if done else None, r.stop_reason if done else None,
                            len(r.prompt_token_ids), len(r.output_token_ids),
                            t.error if done else None, prompt_lp)

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
        return self.scheduler.kv_cache_manager.usage

    def snapshot(self) -> CoreSnapshot:
        kv, sched, e = self.scheduler.kv_cache_manager, self.scheduler, self.engine
        rc, graphs, c = e.replay_counters, e.graphs, self.counters
        return CoreSnapshot(
            num_running=self.num_running, num_waiting=self.num_waiting,
            num_blocks=kv.num_blocks, num_free_blocks=kv.num_free, block_size=kv.block_size,
            num_preemptions=sched.preemptions, iterations=c.iterations,
            requests_added=c.requests_added, requests_finished=c.requests_finished,
            requests_failed=c.requests_failed, by_reason=MappingProxyType(dict(c.by_reason)),
            decode_steps=rc.decode_steps, decode_steps_replayed=rc.replayed,
            decode_steps_scattered=rc.scattered,
            decode_windows=None if graphs is None else f"{graphs.mode} over buckets "
                                                       f"{graphs.sizes}",
            prefix_cache_queries=sched.prefix_cache_queries,
            prefix_cache_hits=sched.prefix_cache_hits, prefix_cache_evictions=kv.evictions,
            recomputed_tokens=sched.recomputed_tokens, forward_passes=e.forward_passes,
            row_steps=e.row_steps, tokens_computed=e.tokens_computed,
            positions_computed=e.positions_computed, kv_cache_usage=kv.usage,
            spec_decode=e.spec_stats.copy() if self.proposer is not None else None)

    def keep_window_blocks(self) -> None:
        """Measurement only (``nanoserve.bench.window_pool``): a fresh pool that keeps every
        block however far behind a sliding window it falls, so the same weights can be run
        with and without blocks given back. Refused once a request has arrived."""
        sched = self.scheduler
        if self.counters.requests_added or sched.has_unfinished():
            raise RuntimeError("keep_window_blocks: requests have already used this pool")
        old = sched.kv_cache_manager
        kv = KVCacheManager(old.pool.num_blocks, old.block_size, old.pool.caching)
        sched.kv_cache_manager = kv
        self.engine.share_pool(kv)

    def check_invariants(self) -> None:
        """Every block free or held by exactly one running request, every slot likewise
        (``AssertionError`` naming what broke)."""
        self.scheduler.check_invariants()

    def check_drained(self) -> None:
        """After a drain every block is back in the pool and every slot is free."""
        kv = self.scheduler.kv_cache_manager
        assert not self.scheduler.has_unfinished(), "requests are still in the scheduler"
        assert kv.num_free == kv.num_blocks, (
            f"a KV block leaked: {kv.num_blocks - kv.num_free} of {kv.num_blocks} held")
        self.scheduler.check_invariants()  # the pool's own, and every slot free again
        assert all(len(t) == 0 for t in self.engine.cache.tables), "a cache row kept blocks"

    def release_finished(self) -> None:
        """Give back the blocks and slots of requests that finished in the last step: what the
        next ``step()`` would do first, for a driver that stops instead."""
        self._release_proposals(self.scheduler.release_finished())

    def close(self) -> None:
        """Stop what the engine runs outside this process (tensor-parallel workers)."""
        self.engine.close()

    def run_to_completion(self) -> None:
        """Step until nothing is left (the offline front door's loop)."""
        if self.driver is not None:
            raise RuntimeError(f"this engine core is driven by {self.driver}; submit requests "
                               f"there instead of stepping it from a second thread")
        with torch.inference_mode():
            while self.has_unfinished():
                self.step()

