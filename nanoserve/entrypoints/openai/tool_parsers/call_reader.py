"""One machine for both ways of reading: ``StreamingToolParser`` and its ``ObjectCallReader``.

Why this module exists: the stream and the whole response must agree for every way the text
is cut, and two separate implementations would drift. So each format is written once, as a
stream: ``feed`` appends to a buffer and steps a small state machine, and a step decides only
what no later text could change (a marker half-arrived, such as ``<tool_ca``, stays held).
``extract`` runs a fresh copy of that machine over the whole text with ``early = False``.

The one choice left is the moment a call is believed. By default (``early = False``) a
stream, like ``extract``, sends nothing of a call until its whole object has arrived and been
judged (valid JSON, a known name, arguments an object); then it sends the call's first delta
(id, name, empty arguments) and its arguments in one fragment. So the stream and the whole
response agree for every output, malformed ones included: broken model output is content in
both. ``early = True`` is vLLM's way: the first delta goes out as soon as the name is complete
and known and the arguments' ``{`` has arrived, and the arguments stream as they come. It
cannot take a call back: when a call sent early turns out broken (its arguments never close,
a bracket does not match, the JSON is invalid), the call ends with the arguments that went out,
the text from where it broke is content, and no further call is read, while ``extract`` calls
the same text content. The server keeps the default: a client never sees a call it cannot
parse, at the price of receiving each call's arguments at once (Day 80 measures the wait).

Content is kept in *runs* (the stretches between calls): a run of whitespace alone is dropped
when the response made a call (``content`` is ``None`` for a response that is only calls), and
kept otherwise; any other run is content exactly as written.
"""

from __future__ import annotations

from typing import ClassVar

from nanoserve.entrypoints.openai.tool_parsers.base import (
    CallDelta,
    Extracted,
    ParsedCall,
    StreamDelta,
    ToolParser,
)
from nanoserve.entrypoints.openai.tool_parsers.json_scan import (
    NEED,
    Scanner,
    header,
    is_object,
    read_call,
    skip_ws,
)

WAIT, DONE, BROKEN, FAILED = "wait", "done", "broken", "failed"


class ObjectCallReader:
    """Reads one call whose JSON object starts at ``buf[start]``: ``{"name": ..., "arguments":
    {...}}``, or, when ``name`` is given (Mistral's ``name{...}``), the arguments object itself.

    ``step(buf, final)`` -> ``(WAIT, 0)``, ``(DONE, end)`` (the call went out whole; it ended at
    ``buf[end]``), ``(BROKEN, 0)`` (not a call; nothing went out) or ``(FAILED, at)`` (a call
    that went out early broke: ``buf[at:]`` is content)."""

    def __init__(self, parser: StreamingToolParser, start: int, name: str | None = None):
        self.parser = parser
        self.start = start
        self.name = name
        self.outer = Scanner(start)          # the whole object
        self.args: Scanner | None = None     # the arguments, once the call went out early
        self.args_start = 0
        self.sent_name = ""                  # the name that went out early
        self.sent = 0                        # buf index up to which the arguments went out
        self.slow = not parser.early         # judge the object whole before sending anything

    def step(self, buf: str, final: bool) -> tuple[str, int]:
        p = self.parser
        if self.name is not None and not p.known(self.name):
            return BROKEN, 0
        if self.args is None and not self.slow:
            if self.name is not None:
                self._commit(self.name, self.start, self.outer)
            else:
                h = header(buf, self.start, p.args_keys)
                if h == NEED and not final:
                    return WAIT, 0
                if isinstance(h, tuple) and p.known(h[0]):
                    self._commit(h[0], h[1], Scanner(h[1]))
                else:
                    self.slow = True
        self.outer.advance(buf)
        if self.args is not None:
            return self._stream(buf, final)
        o = self.outer
        if o.bad is not None or (o.end is None and final):
            return BROKEN, 0
        if o.end is None:
            return WAIT, 0
        got = self._judge(buf[self.start:o.end])
        if got is None:
            return BROKEN, 0
        name, a, b = got
        p.begin_call(name)
        p.call_args(buf[self.start + a:self.start + b])
        return DONE, o.end

    def _judge(self, obj: str) -> tuple[str, int, int] | None:
        """``(name, start, end)`` of a valid call's arguments within ``obj``, else ``None``."""
        if self.name is not None:
            return (self.name, 0, len(obj)) if is_object(obj) else None
        got = read_call(obj, self.parser.args_keys)
        return got if got is not None and self.parser.known(got[0]) else None

    def _commit(self, name: str, args_start: int, scanner: Scanner) -> None:
        self.args, self.args_start, self.sent = scanner, args_start, args_start
        self.sent_name = name
        self.parser.begin_call(name)

    def _stream(self, buf: str, final: bool) -> tuple[str, int]:
        a, o = self.args, self.outer
        a.advance(buf)
        upto = a.end if a.end is not None else a.bad if a.bad is not None else a.pos
        if upto > self.sent:
            self.parser.call_args(buf[self.sent:upto])
            self.sent = upto
        if a.bad is not None:
            return FAILED, a.bad
        if a.end is None:
            return (FAILED, len(buf)) if final else (WAIT, 0)
        if a is not o:                       # the call object goes on after its arguments
            j = skip_ws(buf, a.end)
            if j == len(buf) and not final:
                return WAIT, 0
            if j == len(buf) or buf[j] not in ",}" or o.bad is not None:
                return FAILED, a.end
            if o.end is None:
                return (FAILED, a.end) if final else (WAIT, 0)
        want = (self.sent_name, self.args_start - self.start, a.end - self.start)
        got = self._judge(buf[self.start:o.end])
        if got != want:
            return FAILED, a.end
        return DONE, o.end


class StreamingToolParser(ToolParser):
    """A ``ToolParser`` written once, as a stream: subclasses implement ``_step(final)``, one
    decision over ``self.buf`` (``True`` if it made progress), with ``text``, ``begin_call``,
    ``call_args`` and ``fail`` to say what they found."""

    args_keys: ClassVar[tuple[str, ...]] = ("arguments",)  # keys that may hold the arguments

    def __init__(self, tools: list[dict] | None = None, early: bool = False):
        super().__init__(tools)
        self.early = early         # send a call's name before its object has closed
        self.buf = ""              # received, not yet released
        self.out = StreamDelta()   # what the current feed releases
        self.n_calls = 0
        self.pending = ""          # the current run while it is only whitespace
        self.dirty = False         # the current run has more than whitespace (sent as it comes)
        self.stopped = False       # an early call broke: everything from here is content
        self.reader: ObjectCallReader | None = None

    # the contract

    def extract(self, text: str) -> Extracted:
        twin = type(self)(list(self.tools.values()), early=False)
        twin.make_id = self.make_id
        calls: list[ParsedCall] = []
        content = ""
        for d in (twin.feed(text), twin.finish()):
            content += d.content
            for c in d.calls:
                if c.name is not None:
                    calls.append(ParsedCall(c.id or "", c.name, ""))
                calls[c.index].arguments += c.arguments
        return Extracted(calls, content or None)

    def feed(self, delta: str) -> StreamDelta:
        self.buf += delta
        return self._drain(False)

    def finish(self) -> StreamDelta:
        out = self._drain(True)
        if self.pending and not self.n_calls:
            out.content += self.pending
        self.pending = ""
        return out

    def _drain(self, final: bool) -> StreamDelta:
        self.out = out = StreamDelta()
        for _ in range(8 * len(self.buf) + 64):  # each step consumes text or changes state
            if self.stopped:
                self.text(self.buf)
                self.buf = ""
                break
            if not self._step(final):
                break
        return out

    def _step(self, final: bool) -> bool:
        raise NotImplementedError

    # what a step reports

    def text(self, s: str) -> None:
        """Ordinary text of the current run."""
        if not s:
            return
        if not self.dirty:
            if not s.strip():
                self.pending += s
                return
            s, self.pending, self.dirty = self.pending + s, "", True
        self.out.content += s

    def begin_call(self, name: str) -> None:
        """A call's first delta; the run before it, if only whitespace, is dropped."""
        self.pending, self.dirty = "", False
        self.out.calls.append(CallDelta(self.n_calls, id=self.make_id(), name=name))
        self.n_calls += 1

    def call_args(self, fragment: str) -> None:
        last = self.out.calls[-1] if self.out.calls else None
        if last is not None and last.index == self.n_calls - 1 and last.name is None:
            last.arguments += fragment
        else:
            self.out.calls.append(CallDelta(self.n_calls - 1, arguments=fragment))

    def read(self, final: bool) -> tuple[str, int]:
        """Step the current ``reader``; it is dropped once it has an answer."""
        kind, at = self.reader.step(self.buf, final)
        if kind != WAIT:
            self.reader = None
        if kind == FAILED:
            self.buf, self.stopped = self.buf[at:], True
        return kind, at

    def as_text(self, at: int) -> None:
        """``buf[at]`` is content after all (a marker that began no call); read on after it."""
        self.text(self.buf[at:at + 1])
        self.buf = self.buf[at + 1:]
