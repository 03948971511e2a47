"""A Hermes tool-call reader: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in a
model's text becomes a call, everything else stays content; one machine, two ways to run it.

The machine is written once, as a stream (``feed`` per delta, then ``finish``), and a whole
response is read by feeding it in one piece (``extract``). The one choice left is when a call
is believed, the switch ``early``:

- ``early=False`` (the default, and always the whole reading): nothing of a call goes out until
  its object has closed and been judged: valid JSON, a known name, arguments an object. Then
  the call goes out at once, its name and its arguments. A stream run this way reads every
  response, broken ones included, exactly as the whole reading does.
- ``early=True`` (vLLM's way): a call goes out as soon as ``{"name": "<a known tool>",
  "arguments": {`` has arrived (its first delta: the name), and the arguments follow as they
  arrive, cut wherever the deltas were cut.

For every well-formed response the two agree, wherever the cuts fall. They part on a call that
goes out early and then breaks (a stray comma, a bracket that does not match, text that stops):
a stream cannot take back what it sent, so the call keeps the arguments that went out and the
rest of the text is content; the whole reading makes all of it content. A ``<tool_call>`` that
begins no call is content from its ``<`` on, and reading goes on after that ``<``.

The stream holds back only a tail that could still become ``<tool_call>`` (``holdback.held``)
and a run of whitespace, which is dropped if a call follows: a response that is only calls has
no content. A call's ``arguments`` is the object's text as written, never re-serialised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .holdback import split_safe

START, END = "<tool_call>", "</tool_call>"
HEADER = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')


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


@dataclass
class Call:
    name: str
    arguments: str  # the JSON object as the model wrote it


def object_end(s: str, i: int) -> int | None:
    """``s[i]`` is ``{``: the index after its matching ``}``; ``None`` if it has not arrived;
    ``-j`` - 1 when ``s[j]`` is a closer that does not match. Strings and escapes are
    skipped; the rest of JSON's grammar is ``json.loads``'s business, once the end is known."""
    stack, j, in_string = [], i, False
    while j < len(s):
        c = s[j]
        if in_string:  # skip to the closing quote, an escaped character at a time
            j += 2 if c == "\\" else 1
            in_string = c != '"'
            continue
        if c == '"':
            in_string = True
        elif c in "{[":
            stack.append(c)
        elif c in "}]":
            if not stack or stack.pop() != "{["[c == "]"]:
                return -j - 1
            if not stack:
                return j + 1
        j += 1
    return None


def judge(obj: str, tools: set[str]) -> tuple[str, int, int] | None:
    """A whole call object -> (name, start, end) of its arguments' text, or ``None``."""
    head = HEADER.match(obj)
    try:
        value = json.loads(obj)
    except ValueError:
        return None
    if not head or value.get("name") not in tools or not isinstance(value["arguments"], dict):
        return None
    end = object_end(obj, head.end())
    return (value["name"], head.end(), end) if obj[end:].strip() == "}" else None


class HermesStream:
    def __init__(self, tools: set[str], early: bool = False):
        self.tools, self.early = tools, early
        self.buf = ""          # received, not yet released
        self.state = "text"    # text | call | close | stopped
        self.index = 0         # calls begun
        self.args_at = None    # a call that went out early: where its arguments start in buf
        self.sent = 0          # and the buf index its arguments went out up to
        self.pending = ""      # the current run, while it is only whitespace
        self.out = Delta()

    def feed(self, delta: str) -> Delta:
        self.buf += delta
        return self._drain(final=False)

    def finish(self) -> Delta:
        out = self._drain(final=True)
        out.content += "" if self.index else self.pending or ""
        return out

    # what the machine reports

    def _text(self, s: str) -> None:
        if self.pending is not None and not s.strip():
            self.pending += s
        elif s:
            self.out.content += (self.pending or "") + s
            self.pending = None  # this run has text: no longer held

    def _begin(self, name: str) -> None:
        self.out.calls.append(Piece(self.index, name=name))
        self.index += 1
        self.pending = ""  # the run before a call, if only whitespace, is dropped

    def _args(self, s: str) -> None:
        if s:
            self.out.calls.append(Piece(self.index - 1, arguments=s))

    # the machine

    def _drain(self, final: bool) -> Delta:
        self.out = Delta()
        while self._step(final):
            pass
        return self.out

    def _step(self, final: bool) -> bool:
        buf = self.buf
        if self.state == "stopped":
            self._text(buf)
            self.buf = ""
            return False
        if self.state == "text":
            k = buf.find(START)
            if k < 0:
                now, self.buf = (buf, "") if final else split_safe(buf, START)
                self._text(now)
                return False
            self._text(buf[:k])
            self.buf, self.state = buf[k:], "call"
            return True
        if self.state == "close":  # whitespace, then the closing marker; else text
            rest = buf.lstrip()
            if END.startswith(rest) and rest != END and not final:
                return False
            self.buf, self.state = rest[len(END):] if rest.startswith(END) else rest, "text"
            return True
        return self._call(final)

    def _call(self, final: bool) -> bool:
        """``buf`` starts with ``<tool_call>``: read the call, or give its ``<`` back."""
        body = len(START) + len(self.buf[len(START):]) - len(self.buf[len(START):].lstrip())
        if body == len(self.buf) and not final:
            return False
        if not self.buf.startswith("{", body):
            return self._not_a_call()
        head = HEADER.match(self.buf, body)
        if self.early and self.args_at is None and head and json.loads(head[1]) in self.tools:
            self._begin(json.loads(head[1]))
            self.args_at = self.sent = head.end()
        if self.args_at is not None:
            return self._stream(body, final)
        end = object_end(self.buf, body)
        if end is None and not final:
            return False
        call = judge(self.buf[body:end], self.tools) if end and end > 0 else None
        if call is None:
            return self._not_a_call()
        name, a, b = call
        self._begin(name)
        self._args(self.buf[body + a:body + b])
        self.buf, self.state = self.buf[end:], "close"
        return True

    def _stream(self, body: int, final: bool) -> bool:
        """A call that went out early: send its arguments on; judge it when they close."""
        end = object_end(self.buf, self.args_at)
        upto = len(self.buf) if end is None else end if end > 0 else -end - 1
        self._args(self.buf[self.sent:upto])
        self.sent = upto
        if end is None:
            return self._broken(upto) if final else False
        rest = self.buf[upto:].lstrip()
        if end < 0 or (not rest and final) or (rest and rest[0] != "}"):
            return self._broken(upto)
        if not rest:
            return False
        close = len(self.buf) - len(rest) + 1
        if judge(self.buf[body:close], self.tools) is None:
            return self._broken(upto)
        self.buf, self.state, self.args_at = self.buf[close:], "close", None
        return True

    def _broken(self, at: int) -> bool:
        """An early call broke: it keeps what went out; the rest of the text is content."""
        self.buf, self.state, self.args_at = self.buf[at:], "stopped", None
        return True

    def _not_a_call(self) -> bool:
        self._text(self.buf[0])
        self.buf, self.state = self.buf[1:], "text"
        return True


def extract(text: str, tools: set[str]) -> tuple[list[Call], str | None]:
    """A whole response -> (calls, content): the machine fed once, calls judged whole."""
    s = HermesStream(tools, early=False)
    calls, content = [], ""
    for d in (s.feed(text), s.finish()):
        content += d.content
        for p in d.calls:
            if p.name is not None:
                calls.append(Call(p.name, ""))
            else:
                calls[p.index].arguments += p.arguments
    return calls, content or None
