"""``ToolParser``: the one interface every tool-call format implements, whole and streamed.

Why this module exists: a chat response is read twice over, by two different consumers. A
whole response (``extract``) sees the finished text once. A stream (``feed`` per text delta,
then ``finish``) sees it in pieces cut wherever the tokenizer cut it, so a marker such as
``<tool_call>`` can arrive as ``<tool`` and ``_call>``. Both must agree: the stream's content
deltas joined equal the whole response's ``content``, and each call's argument fragments
joined equal its ``arguments``. The base class holds what every format shares: the request's
tools (a call to a function that is not among them is text, not a call), call ids, and the
rule that output the parser cannot read is content, never an error.

A call's ``arguments`` is the JSON object exactly as the model wrote it (checked with
``json.loads``, never re-serialised), so the streamed fragments, which are slices of that text,
join to it.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(slots=True)
class ParsedCall:
    """One complete call: its id, the function's name, the arguments as JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Extracted:
    """A whole response read: the calls (none: the model answered in text) and the text that
    is not a call (``None`` when there is none)."""

    calls: list[ParsedCall] = field(default_factory=list)
    content: str | None = None

    @property
    def called(self) -> bool:
        return bool(self.calls)


@dataclass(slots=True)
class CallDelta:
    """A piece of call number ``index`` in a stream. The first piece of a call has ``id`` and
    ``name`` set and ``arguments == ""``; the later ones only ``arguments`` fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class StreamDelta:
    """What one ``feed`` (or ``finish``) releases: text for ``content`` and call pieces."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


def random_id(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


class ToolParser:
    """Base class: ``extract`` for a whole response, ``feed`` + ``finish`` for a stream.

    One instance reads one choice (it keeps the stream's state). ``tools`` are the request's
    function definitions as dicts (``{"name", "parameters", ...}``); ``None`` or empty means
    any name is accepted.
    """

    name: ClassVar[str] = ""

    def __init__(self, tools: list[dict] | None = None):
        self.tools = {t["name"]: t for t in tools or []}

    def known(self, name: object) -> bool:
        """Whether ``name`` may be called: a string naming one of the request's tools."""
        return isinstance(name, str) and bool(name) and (not self.tools or name in self.tools)

    def make_id(self) -> str:
        """A fresh call id; OpenAI's look is ``call_`` and 24 letters and digits."""
        return "call_" + random_id(string.ascii_letters + string.digits, 24)

    def extract(self, text: str) -> Extracted:
        raise NotImplementedError

    def feed(self, delta: str) -> StreamDelta:
        raise NotImplementedError

    def finish(self) -> StreamDelta:
        """The end of the stream: release whatever was held back (as content, if it never
        became a call)."""
        raise NotImplementedError
