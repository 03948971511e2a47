"""The engine requests behind one HTTP request: opened together, watched, aborted together.

Why this module exists: one HTTP request is ``prompts x n`` engine requests, and two promises
hold for all of them at once:

- **all or nothing**: ``open_fanout`` starts every one and waits until each has been accepted
  and has news; if one is refused (a bad value, ``Overloaded``) the others are aborted and the
  client gets that error, before any byte of a response;
- **a client that hangs up costs nothing**: while a response is pending, ``until_disconnect``
  watches the connection, and a disconnect aborts every engine request behind it (``collect``
  for a whole response; the SSE response's ``on_close`` for a stream).

``Choice`` is one engine request as the response sees it: its text, ids and logprobs so far,
its prompt logprobs once its prefill is done, and its usage so far (a stream with
``continuous_usage_stats`` puts that on every chunk).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request

from nanoserve.entrypoints.openai.errors import ClientGone, as_api_error, failure
from nanoserve.entrypoints.openai.metrics import ServerMetrics
from nanoserve.entrypoints.openai.protocol import UsageInfo
from nanoserve.sampling.params import SamplingParams

DISCONNECT_POLL_S = 0.05  # how often a pending response checks that its client is still there


class Fanout:
    """Several engine requests behind one HTTP request, merged into one stream of
    ``(index, RequestDelta | Exception)``. ``close()`` aborts whatever has not finished."""

    def __init__(self, engine, metrics: ServerMetrics, jobs: list, arrival: float):
        self.engine = engine
        self.rids = [rid for rid, _, _ in jobs]
        self.trackers = [metrics.track(arrival) for _ in jobs]
        self.open = set(range(len(jobs)))
        self.queue: asyncio.Queue = asyncio.Queue()
        self.buffer: list = []
        self.tasks = [asyncio.create_task(self._pump(i, ids, sp))
                      for i, (_, ids, sp) in enumerate(jobs)]

    async def _pump(self, i: int, ids: list[int], sp: SamplingParams) -> None:
        try:
            async for d in self.engine.generate(ids, sp, self.rids[i]):
                self.trackers[i].delta(d)
                self.queue.put_nowait((i, d))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which decides
            self.trackers[i].done = True
            self.queue.put_nowait((i, e))

    async def prime(self) -> None:
        """Wait until every request is accepted and has news; raise the first refusal."""
        seen: set[int] = set()
        while len(seen) < len(self.rids):
            i, item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            seen.add(i)
            self.buffer.append((i, item))

    async def events(self):
        while self.buffer or self.open:
            i, item = self.buffer.pop(0) if self.buffer else await self.queue.get()
            if isinstance(item, Exception) or item.finished:
                self.open.discard(i)
            yield i, item

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for i in sorted(self.open):
            self.engine.abort(self.rids[i])
            self.trackers[i].abort()
        self.open.clear()


async def until_disconnect(request: Request, aw):
    """Await ``aw`` unless the client hangs up first (then ``ClientGone``)."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()


@dataclass(slots=True)
class Choice:
    index: int
    prompt_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_output_tokens: int = 0
    prompt_logprobs: list | None = None  # [None, TokenLogprob, ...] once the prefill is done

    def add(self, d) -> None:
        self.text += d.new_text
        self.token_ids += d.new_token_ids
        self.logprobs += d.new_logprobs
        self.num_output_tokens = d.num_output_tokens
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        if d.finished:
            self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason

    def usage(self) -> UsageInfo:
        """This choice's usage so far: what vLLM's ``continuous_usage_stats`` puts on each of
        its chunks (its prompt, the tokens it has generated, their sum)."""
        p = len(self.prompt_ids)
        return UsageInfo(prompt_tokens=p, completion_tokens=self.num_output_tokens,
                         total_tokens=p + self.num_output_tokens)


async def open_fanout(request: Request, engine, metrics: ServerMetrics, jobs: list,
                      arrival: float) -> Fanout:
    """Start every job and wait until all are accepted; on any refusal abort them all."""
    fan = Fanout(engine, metrics, jobs, arrival)
    try:
        await until_disconnect(request, fan.prime())
    except BaseException as e:
        fan.close()
        if isinstance(e, Exception) and not isinstance(e, ClientGone):
            raise as_api_error(e) from None
        raise
    return fan


async def collect(request: Request, fan: Fanout, choices: list[Choice]) -> None:
    """Run every request to its end into ``choices`` (a whole, non-streamed response)."""
    async def drain():
        async for i, item in fan.events():
            err = failure(item)
            if err is not None:
                raise err
            choices[i].add(item)
    try:
        await until_disconnect(request, drain())
    finally:
        fan.close()


def usage(prompts: list[list[int]], choices: list[Choice]) -> UsageInfo:
    p = sum(len(ids) for ids in prompts)
    c = sum(ch.num_output_tokens for ch in choices)
    return UsageInfo(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)
