"""Day 39 snapshot (frozen): server-sent events as OpenAI streams them, and the hang-up watch.

A stream is a sequence of events, each ``data: <one JSON object>`` and a blank line, ended by
the literal ``data: [DONE]``. ``frame`` writes one event the way the server does (compact JSON,
UTF-8 unescaped); ``events`` reads a whole stream back into its objects, ``"[DONE]"`` included.

    >>> frame({"a": 1}) + DONE
    'data: {"a":1}\\n\\ndata: [DONE]\\n\\n'
    >>> events('data: {"a":1}\\n\\ndata: [DONE]\\n\\n')
    [{'a': 1}, '[DONE]']

``until_disconnect(is_disconnected, aw)`` awaits ``aw`` but asks every ``poll`` seconds whether
the client is still there; if not, it cancels ``aw`` and raises ``ClientGone``, so whatever the
request holds (an engine request, its blocks) can be given back at once.
"""

from __future__ import annotations

import asyncio
import json

DONE = "data: [DONE]\n\n"


class ClientGone(Exception):
    """The client hung up while its response was pending."""


def frame(obj: dict) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n\n"


def events(raw: str) -> list:
    out = []
    for block in raw.split("\n\n"):
        data = "".join(line[5:].lstrip() for line in block.split("\n")
                       if line.startswith("data:"))
        if data:
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def until_disconnect(is_disconnected, aw, poll: float = 0.05):
    """The result of ``aw``, unless ``await is_disconnected()`` turns true first."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()
