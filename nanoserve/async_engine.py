"""The async engine: the engine core on a background thread, one asyncio stream per request.

Why this module exists: a server handles many clients on one asyncio event loop, and a forward
pass blocks for milliseconds to seconds. Run the model on the loop and every other client stalls;
so the core lives on its own thread. ``AsyncLLM`` is ``LLM``'s sibling over the engine core, as in
vLLM: ``AsyncLLM(EngineConfig(...))`` loads its own core (``AsyncLLM.from_options(**kw)`` takes
``LLM``'s keywords), and ``AsyncLLM(core)`` drives an existing one, alone. The two sides meet in
exactly two places:

- **in**: ``generate`` checks a request on the caller's side (a bad one is a ``ValueError``
  before anything is queued) and puts it in the inbox; ``abort`` puts an abort there. The engine
  thread takes the whole inbox at the start of every iteration, so an abort lands before the next
  forward and the aborted request's blocks are back before that iteration ends.
- **out**: each iteration's ``RequestDelta``s are handed to their request's ``asyncio.Queue``
  through ``loop.call_soon_threadsafe``, the one thread-safe door into an event loop.

While no request exists the thread blocks on a condition variable: no busy loop, no polling.
Every time the core drains, the thread asserts that every block and slot is back.

``async for delta in engine.generate(ids, params, "id-1")`` yields the request's deltas until one
has ``finished``. If the consumer is cancelled, or stops iterating, the request is aborted: a
client that hangs up costs nothing after the next iteration.

Overload is refused at the door: with ``max_waiting`` set, a request that arrives while that many
are already waiting (in the inbox or in the scheduler's queue, counted together under one lock so
a burst cannot slip past in the iteration before it is scheduled) raises ``Overloaded``. If the
engine thread dies, every stream gets ``EngineDead`` and so does every later request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import AsyncIterator

import torch

from nanoserve.config import EngineConfig
from nanoserve.cpu.threads import bind
from nanoserve.engine.core import EngineCore
from nanoserve.engine.outputs import CoreSnapshot, RequestDelta
from nanoserve.loader import load_core
from nanoserve.sampling.params import SamplingParams
from nanoserve.validation import InvalidRequest


class Overloaded(Exception):
    """Too many requests are already waiting; try again after ``retry_after`` seconds."""

    def __init__(self, waiting: int, limit: int, retry_after: int = 1):
        super().__init__(f"{waiting} requests are already waiting (max_waiting={limit}); "
                         f"retry later")
        self.retry_after = retry_after


class EngineDead(RuntimeError):
    """The engine thread is not running (it died, or the engine is shutting down)."""


class AsyncLLM:
    """The serving front door, a sibling of ``LLM``: built from an ``EngineConfig`` (its own
    core is loaded) or over an existing ``EngineCore``, which it then drives alone."""

    def __init__(self, engine: EngineConfig | EngineCore, max_waiting: int | None = None):
        if max_waiting is not None and (isinstance(max_waiting, bool)
                                        or not isinstance(max_waiting, int) or max_waiting < 0):
            raise ValueError(f"max_waiting must be an int >= 0, got {max_waiting!r}")
        if isinstance(engine, EngineConfig):
            engine = load_core(engine)
        elif not isinstance(engine, EngineCore):
            raise TypeError(f"AsyncLLM takes an EngineConfig or an EngineCore, not "
                            f"{type(engine).__name__} (build it with AsyncLLM.from_options)")
        if engine.driver is not None:
            raise ValueError(f"this engine core is already driven by {engine.driver}")
        self.core = engine
        self.core.driver = "an AsyncLLM"
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, object]] = deque()  # ("add", Request) | ("abort", id)
        self._inbox_adds = 0
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._accepting = True
        self.error: BaseException | None = None  # why the engine thread died
        self.drain_checks = 0  # times the core drained and every block was found back
        self.iterations = 0

    @classmethod
    def from_options(cls, model=None, max_waiting: int | None = None, **options) -> AsyncLLM:
        """``LLM``'s keywords (``EngineConfig``'s names), plus ``max_waiting``."""
        return cls(EngineConfig.from_options(model, **options), max_waiting=max_waiting)

    # ------------------------------------------------------------------ what it serves

    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def generation_defaults(self) -> dict:
        """generation_config.json's sampling defaults (``SamplingParams``' names): the server
        starts every request from them, its own fields on top."""
        loaded = self.core.loaded
        gd = loaded.generation_defaults if loaded is not None else None
        return dict(gd.values) if gd is not None else {}

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.vocab_size

    def snapshot(self) -> CoreSnapshot:
        """The core's snapshot, with waiting counted as the door counts it (inbox included)."""
        snap = self.core.snapshot()
        return dataclasses.replace(snap, num_waiting=self._inbox_adds + snap.num_waiting)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nanoserve-engine",
                                                daemon=True)
                self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    @property
    def errored(self) -> bool:
        return self.error is not None or (self._thread is not None
                                          and not self._thread.is_alive() and not self._stop)

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting; let in-flight requests finish within ``timeout`` seconds, then abort
        the rest; stop the thread. Every block is back when it returns."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline and self.is_running:
            await asyncio.sleep(0.01)
        for request_id in list(self._streams):
            self.abort(request_id)
        deadline = time.monotonic() + 5.0
        while self._streams and time.monotonic() < deadline and self.is_running:
            await asyncio.sleep(0.01)
        self.stop()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.core.close()  # tensor-parallel workers stop with the engine

    # ------------------------------------------------------------------ requests

    @property
    def num_waiting(self) -> int:
        """Waiting requests: those in the inbox and those in the scheduler's queue."""
        return self._inbox_adds + self.core.num_waiting

    @property
    def num_running(self) -> int:
        return self.core.num_running

    @property
    def kv_cache_usage(self) -> float:
        return self.core.kv_cache_usage

    @property
    def num_preemptions(self) -> int:
        return self.core.snapshot().num_preemptions

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestDelta]:
        """Yield the request's deltas until it finishes; abort it if the consumer leaves."""
        if self.errored:
            raise EngineDead(f"the engine thread died: {self.error!r}")
        if not self._accepting:
            raise EngineDead("the engine is shutting down")
        if request_id in self._streams:
            raise InvalidRequest(f"request id {request_id!r} is already live", "request_id",
                                 request_id)
        request = self.core.make_request(request_id, prompt_token_ids, params)
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        with self._cond:
            waiting = self.num_waiting
            if self.max_waiting is not None and waiting >= self.max_waiting:
                raise Overloaded(waiting, self.max_waiting)
            self._streams[request_id] = (loop, queue)
            self._inbox.append(("add", request))
            self._inbox_adds += 1
            self._cond.notify()
        self.start()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def check_grammar(self, spec) -> None:
        """Compile a structured-outputs spec now (cached for its requests); a bad one raises
        ``InvalidRequest`` before any request is made. Safe off the event loop's thread: the
        server runs it on a worker thread so a slow grammar holds up no one else."""
        self.core.grammars().template(spec)

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    # ------------------------------------------------------------------ the engine thread

    def _take_inbox(self) -> bool:
        """Wait for work; move the inbox into the core. False when it is time to stop."""
        with self._cond:
            while not (self._stop or self._inbox or self.core.has_unfinished()):
                self._cond.wait()
            if self._stop:
                return False
            while self._inbox:
                kind, item = self._inbox.popleft()
                if kind == "add":
                    self._inbox_adds -= 1
                    try:
                        self.core.add(item)
                    except ValueError as e:  # a live duplicate id: refuse this one only
                        self._deliver(item.request_id, e)
                else:
                    self.core.abort_request(item)
            return True

    def _run(self) -> None:
        try:
            if self.core.loaded is not None:  # this thread runs every forward: pin its team
                bind(self.core.loaded.binding)
            with torch.inference_mode():
                while self._take_inbox():
                    if not self.core.has_unfinished():
                        continue
                    for delta in self.core.step():
                        self._deliver(delta.request_id, delta)
                    self.iterations += 1
                    if not self.core.has_unfinished():
                        self.core.check_drained()
                        self.drain_checks += 1
                # Stopping: a request that finished in the last step holds its blocks until
                # the next schedule(), which will not come now.
                self.core.release_finished()
        except BaseException as e:  # noqa: BLE001 - every waiting stream must hear of it
            self.error = e
            dead = EngineDead(f"the engine thread died: {type(e).__name__}: {e}")
            for request_id in list(self._streams):
                self._deliver(request_id, dead)

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(item, BaseException) or item.finished:
            del self._streams[request_id]
        loop, queue = stream
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            pass
