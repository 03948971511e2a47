"""Day 37 snapshot (frozen): the Day 36 engine core on a background thread, one asyncio stream
per request.

A server runs every client on one asyncio event loop, and a forward blocks for as long as it
takes. So the core gets a thread of its own, and the two sides touch in two places only:

- **in**: ``generate`` builds and checks the request on the caller's side (a bad request raises
  there and nothing is queued), then appends it to the inbox under the lock; ``abort`` appends an
  abort. The engine thread empties the whole inbox at the top of every iteration, so an abort
  lands before the next forward.
- **out**: each step's deltas go to their request's ``asyncio.Queue`` through
  ``loop.call_soon_threadsafe``, the one call that may reach into a loop from another thread.

With no request in the core and an empty inbox the thread waits on the condition variable: it
does not spin. A consumer that is cancelled, or stops iterating, aborts its request. With
``max_waiting`` set, a request that finds that many already waiting (inbox plus the scheduler's
queue, counted under the same lock the engine thread takes the inbox under) is refused with
``Overloaded``. If the thread dies, every stream and every later request gets ``EngineDead``.

    engine = AsyncEngine(core)
    async for delta in engine.generate("a", [5, 6, 7], max_tokens=4):
        print(delta.new_token_ids)
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import torch

from chapters.day36_engine_core.snapshot.core import EngineCore


class Overloaded(Exception):
    """Too many requests are waiting already."""


class EngineDead(RuntimeError):
    """The engine thread is not running."""


class AsyncEngine:
    def __init__(self, core: EngineCore, max_waiting: int | None = None):
        self.core = core
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._inbox: deque = deque()  # ("add", Request) | ("abort", request id)
        self._inbox_adds = 0
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.error: BaseException | None = None
        self.iterations = 0  # steps taken by the engine thread
        self.wakeups = 0  # times the thread came back from waiting on the condition
        self.drains = 0  # times the core drained and check_drained passed

    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    @property
    def num_waiting(self) -> int:
        return self._inbox_adds + len(self.core.scheduler.waiting)

    # ------------------------------------------------------------------ the caller's side

    async def generate(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                       stop: tuple[str, ...] = ()):
        if self.error is not None or not self._thread.is_alive():
            raise EngineDead(f"the engine thread is not running ({self.error!r})")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already live")
        request = self.core.make_request(request_id, prompt_token_ids, max_tokens, stop)
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        with self._cond:
            if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
                raise Overloaded(f"{self.num_waiting} waiting (max_waiting={self.max_waiting})")
            self._streams[request_id] = (loop, queue)
            self._inbox.append(("add", request))
            self._inbox_adds += 1
            self._cond.notify()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # cancelled, or the consumer stopped iterating
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    # ------------------------------------------------------------------ the engine thread

    def _take_inbox(self) -> bool:
        with self._cond:
            while not (self._stop or self._inbox or self.core.has_unfinished()):
                self._cond.wait()  # idle: no iteration runs until someone notifies
                self.wakeups += 1
            while self._inbox and not self._stop:
                kind, item = self._inbox.popleft()
                if kind == "add":
                    self._inbox_adds -= 1
                    try:
                        self.core.add(item)
                    except ValueError as e:
                        self._deliver(item.request_id, e)
                else:
                    self.core.abort_request(item)
            return not self._stop

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while self._take_inbox():
                    if not self.core.has_unfinished():
                        continue
                    for d in self.core.step():
                        self._deliver(d.request_id, d)
                    self.iterations += 1
                    if not self.core.has_unfinished():
                        self.core.check_drained()
                        self.drains += 1
        except BaseException as e:  # noqa: BLE001 - every stream must hear of it
            self.error = e
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDead(f"the engine thread died: {e!r}"))

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(item, BaseException) or item.finished:
            del self._streams[request_id]
        loop, queue = stream
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop has closed: nobody is listening
            pass
