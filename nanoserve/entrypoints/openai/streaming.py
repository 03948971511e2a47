"""Server-sent events, as OpenAI streams them: ``data: {chunk}`` per delta, then ``[DONE]``.

Why this module exists: a stream has rules of its own that both endpoints share. The status
line is already sent when the first chunk goes out, so an error after that point cannot be a
4xx or 5xx any more: it goes out as an error event in OpenAI's shape, and the stream still ends
with ``data: [DONE]`` so a client's parser finishes cleanly. And a stream can end three ways
(done, failed, or cancelled by a disconnect, possibly before its generator ever ran); whichever
it is, ``SSEResponse`` runs its ``on_close`` (the fanout's ``close``), so nothing leaks.

An endpoint supplies only its chunk shape: ``chunk(choice, delta, first)`` for a delta with news,
``head`` chunks to send first (chat's role), and ``tail()`` for the usage chunk. Usage follows
``stream_options`` as vLLM reads it (``should_include_usage``): ``include_usage`` alone adds the
final usage chunk; with ``continuous_usage_stats`` too, every chunk the endpoint hands over as a
model (not yet a string) also carries its choice's usage so far, the head's with no completion
tokens yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from nanoserve.entrypoints.openai.errors import ApiError, error_body, failure
from nanoserve.entrypoints.openai.fanout import Fanout


@dataclass(frozen=True, slots=True)
class StreamUsage:
    include_usage: bool = False  # a last chunk with the whole request's usage
    continuous: bool = False  # every chunk with its choice's usage so far


def should_include_usage(req) -> StreamUsage:
    """What ``req``'s stream promises about usage (vLLM's ``should_include_usage``:
    ``continuous_usage_stats`` counts only with ``include_usage``). A stream cannot carry
    prompt logprobs: ``prompt_logprobs`` above 0 with ``stream`` is a 400, as vLLM answers."""
    pl = getattr(req, "prompt_logprobs", None)
    if req.stream and pl is not None and pl != 0:
        raise ApiError(400, "prompt_logprobs are not available when stream=true",
                       "prompt_logprobs")
    so = req.stream_options
    include = so is not None and so.include_usage
    return StreamUsage(include, include and so.continuous_usage_stats)


class SSEResponse(StreamingResponse):
    """An event stream that runs ``on_close`` however it ends: done, failed or cancelled (a
    disconnect cancels the stream, possibly before its generator ever started)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(obj) -> str:
    return f"data: {obj.model_dump_json()}\n\n"


def sse_error(err: ApiError) -> str:
    return sse(error_body(err.status, err.message, err.param))


def _event(item, choices: list, usage: StreamUsage | None) -> str:
    """A chunk as an SSE event: a string as it is; a model with its choice's usage so far
    when the stream promises continuous usage."""
    if isinstance(item, str):
        return item
    if usage is not None and usage.continuous and item.choices:
        item.usage = choices[item.choices[0].index].usage()
    return sse(item)


async def sse_events(fan: Fanout, choices: list, want_lp: bool, chunk, head=(), tail=None,
                     usage: StreamUsage | None = None):
    """The SSE body: ``head`` chunks, one ``chunk(choice, delta, first)`` per delta with news,
    then ``tail()`` (the usage chunk) if given, then ``[DONE]``. An error ends it early, as an
    error event, still followed by ``[DONE]``. Chunks may be strings or models; a model gets
    its choice's usage when ``usage.continuous``."""
    for h in head:
        yield _event(h, choices, usage)
    async for i, item in fan.events():
        err = failure(item)
        if err is not None:
            yield sse_error(err)
            break
        c = choices[i]
        first = not c.token_ids and not c.text
        c.add(item)
        if item.new_text or item.finished or (want_lp and item.new_logprobs):
            yield _event(chunk(c, item, first), choices, usage)
    else:
        if tail is not None:
            yield tail()
    yield "data: [DONE]\n\n"
