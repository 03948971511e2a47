"""A Hermes tool-call reader, whole and streamed: ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` in a model's text becomes a call; everything else stays content.

The two readers answer to one rule: whatever cuts the stream arrives in, the content pieces
joined are the whole reading's content and each call's argument pieces joined are its
arguments. The stream therefore holds back two things only: a tail that could still become
``<tool_call>`` (``holdback.held``, at most ten characters), and a call whose closing marker
has not arrived, because until then nobody can say whether its JSON will parse. A call that
does not read (broken JSON, a name not among the tools, no closing marker) is put back into
the content, markers and all, exactly as the model wrote it.

A call's ``arguments`` is the object's text as written, sliced out, never re-serialised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .holdback import split_safe

START, END = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*')
_MID = re.compile(r'\s*,\s*"arguments"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*\Z")
_DECODER = json.JSONDecoder()


@dataclass
class Call:
    name: str
    arguments: str  # the JSON object as the model wrote it


@dataclass
class Piece:
    """Part of call ``index`` in a stream: the first carries the name, the rest arguments."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class Delta:
    content: str = ""
    calls: list[Piece] = field(default_factory=list)


def read_call(body: str, tools: set[str]) -> Call | None:
    """The text between the markers -> a call, or ``None`` when it is not one: the object must
    be ``{"name": <a tool's name>, "arguments": <an object>}``, keys in that order."""
    head = _HEAD.match(body)
    try:
        name, at = _DECODER.raw_decode(body, head.end()) if head else (None, 0)
        mid = _MID.match(body, at)
        args, end = _DECODER.raw_decode(body, mid.end()) if mid else (None, 0)
    except json.JSONDecodeError:
        return None
    if name not in tools or not isinstance(args, dict) or not _TAIL.match(body, end):
        return None
    return Call(name, body[mid.end():end])


def extract(text: str, tools: set[str]) -> tuple[list[Call], str | None]:
    """A whole response -> (calls, content); content is ``None`` when there is none."""
    calls, content, pos = [], [], 0
    while (i := text.find(START, pos)) >= 0 and (j := text.find(END, i)) >= 0:
        call = read_call(text[i + len(START):j], tools)
        content.append(text[pos:j + len(END)] if call is None else text[pos:i])
        calls += [call] if call else []
        pos = j + len(END)
    content.append(text[pos:])
    return calls, "".join(content) or None


class HermesStream:
    """One choice's stream: ``feed(delta)`` per text delta, then ``finish()``."""

    def __init__(self, tools: set[str]):
        self.tools = tools
        self.buf = ""  # held back: a possible marker's start, or an open call
        self.index = 0  # the next call's number

    def feed(self, delta: str) -> Delta:
        self.buf += delta
        out = Delta()
        while (i := self.buf.find(START)) >= 0:
            j = self.buf.find(END, i)
            if j < 0:  # an open call: the text before it may go, the call waits
                out.content += self.buf[:i]
                self.buf = self.buf[i:]
                return out
            call = read_call(self.buf[i + len(START):j], self.tools)
            if call is None:
                out.content += self.buf[:j + len(END)]
            else:
                out.content += self.buf[:i]
                out.calls += [Piece(self.index, name=call.name), Piece(self.index,
                                                                       arguments=call.arguments)]
                self.index += 1
            self.buf = self.buf[j + len(END):]
        now, self.buf = split_safe(self.buf, START)
        out.content += now
        return out

    def finish(self) -> Delta:
        """The stream is over: whatever waits (a marker's start, an unclosed call) is text."""
        out, self.buf = Delta(content=self.buf), ""
        return out
