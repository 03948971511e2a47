"""Reading a forced call: the JSON that ``nanoserve.structured.tools``' grammar made (Day 79).

Why this module exists: under ``tool_choice: "required"`` or a named function the model's
answer (after any thinking, which the reasoning parser takes first) is bare JSON, not a format
the model chose: for a named function the arguments object itself, for ``"required"`` an array
of ``{"name": ..., "parameters": {...}}``. The server still owes the client OpenAI's shape
(``tool_calls`` with ids, names and JSON-string arguments, whole or streamed), so these two
parsers read that JSON in ``ToolParser``'s interface.

A call's ``arguments`` is the exact text of the arguments object as written (for ``"required"``
the text of each element's ``"parameters"`` value), so the stream's fragments, slices of that
text, join to it. Whitespace around the JSON (the grammar allows newlines after ``</think>``)
is not part of any call.

Text that is not a complete, valid call (cut by ``max_tokens``, say, or a name not among the
tools) is content in ``extract``, never an error. A stream cannot take back what it sent: it
starts a call as soon as the text shows one (the ``{`` of the arguments; for ``"required"``
each element's complete, known ``name``) and sends argument fragments as they arrive, so a
response that then breaks off leaves the stream with a call whose arguments are unfinished,
and ``finish`` sends nothing more. Text that never started a call (an empty answer, a first
character that cannot begin the JSON, ``[]``, an unknown name in the first element) streams
as content, as ``extract`` reports it.
"""

from __future__ import annotations

import json
import re

from nanoserve.entrypoints.openai.tool_parsers.base import (
    CallDelta,
    Extracted,
    ParsedCall,
    StreamDelta,
    ToolParser,
)

_WS = " \t\n\r"
_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")
_PARTIAL = ("true", "false", "null", "-")  # what a cut scalar may be the start of


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


class _Values:
    """Where JSON values end, remembered: the text only grows, so a value's scan resumes
    where the last feed left it and a stream costs time linear in its length.

    ``end(s, i)``: the index after the value starting at ``s[i]``, ``None`` when the text ends
    inside it (a scalar running to the end may go on), ``-1`` when it is no JSON value.
    Brackets are counted, not matched: ``json.loads`` judges the whole text at the end."""

    def __init__(self) -> None:
        self.state: dict[int, list] = {}  # start -> [next index, depth, in string, end]

    def end(self, s: str, i: int) -> int | None:
        if i >= len(s):
            return None
        if s[i] not in '"{[':
            m = _SCALAR.match(s, i)
            if m and m.end() < len(s):
                return m.end()
            tail = s[i:]  # the value runs to the end: a number or literal may go on
            return None if m or any(w.startswith(tail) for w in _PARTIAL) else -1
        st = self.state.setdefault(i, [i, 0, False, None])
        j, depth, in_str, done = st
        while done is None and j < len(s):
            c = s[j]
            if in_str:
                if c == "\\":
                    j += 1
                elif c == '"':
                    in_str = False
                    if depth == 0:
                        done = j + 1
            elif c == '"':
                in_str = True
            else:
                depth += (c in "{[") - (c in "}]")
                if depth == 0:
                    done = j + 1
            j += 1
        if j > len(s):  # a backslash was the last character: read it again next time
            j = len(s) - 1
        st[:] = [j, depth, in_str, done]
        return done


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return _BAD


_BAD = object()


class NamedCallParser(ToolParser):
    """``tool_choice`` naming one function: the answer is that function's arguments object."""

    name = "forced_named"

    def __init__(self, tools: list[dict] | None, name: str):
        super().__init__(tools)
        self.function = name
        self._text = ""  # everything fed
        self._start: int | None = None  # where the arguments object begins
        self._sent = 0  # characters of the arguments sent
        self._content = False  # the text never began a call: it streams as content
        self._values = _Values()

    def extract(self, text: str) -> Extracted:
        body = text.strip(_WS)
        try:
            args = json.loads(body)
        except ValueError:
            args = None
        if not isinstance(args, dict) or not self.known(self.function):
            return Extracted(content=text or None)
        return Extracted(calls=[ParsedCall(self.make_id(), self.function, body)])

    def feed(self, delta: str) -> StreamDelta:
        if self._content:
            return StreamDelta(content=delta)
        self._text += delta
        out = StreamDelta()
        if self._start is None:
            i = _skip(self._text, 0)
            if i == len(self._text):
                return out  # only whitespace so far: nothing is decided
            if self._text[i] != "{" or not self.known(self.function):
                self._content = True
                return StreamDelta(content=self._text)
            self._start = i
            out.calls.append(CallDelta(0, self.make_id(), self.function, ""))
        end = self._values.end(self._text, self._start)
        stop = len(self._text) if end is None or end < 0 else end
        if stop > self._start + self._sent:
            out.calls.append(CallDelta(0, arguments=self._text[self._start + self._sent:stop]))
            self._sent = stop - self._start
        return out

    def finish(self) -> StreamDelta:
        if self._start is None and not self._content and self._text:
            return StreamDelta(content=self._text)  # whitespace only: content, as extract says
        return StreamDelta()


def _scan_calls(s: str, values: _Values):
    """Read ``s`` as far as it goes as an array of ``{"name": ..., "parameters": ...}``.

    -> ``(calls, state)``: ``calls`` a list of ``[name, params_start, params_end]`` (``name``
    ``None`` until its string is complete; ``params_end`` ``None`` until the value is),
    ``state`` ``"open"`` (the text ends inside the array), ``"closed"`` or ``"broken"``."""
    calls: list[list] = []
    i = _skip(s, 0)
    if i == len(s):
        return calls, "open"
    if s[i] != "[":
        return calls, "broken"
    i = _skip(s, i + 1)
    if i < len(s) and s[i] == "]":
        return calls, "closed"
    while True:
        if i == len(s):
            return calls, "open"
        if s[i] != "{":
            return calls, "broken"
        call: list = [None, None, None]
        calls.append(call)
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "}":
            i += 1
        else:
            while True:  # the element's members: "key": value, ...
                if i == len(s):
                    return calls, "open"
                if s[i] != '"':
                    return calls, "broken"
                key_end = values.end(s, i)
                if key_end is None:
                    return calls, "open"
                key = _loads(s[i:key_end])
                i = _skip(s, key_end)
                if i == len(s):
                    return calls, "open"
                if s[i] != ":" or key is _BAD:
                    return calls, "broken"
                v = _skip(s, i + 1)
                end = values.end(s, v)
                if end == -1:
                    return calls, "broken"
                if key == "parameters" and v < len(s):
                    call[1], call[2] = v, end
                if end is None:
                    return calls, "open"
                if key == "name":
                    call[0] = _loads(s[v:end])
                i = _skip(s, end)
                if i == len(s):
                    return calls, "open"
                if s[i] == "}":
                    i += 1
                    break
                if s[i] != ",":
                    return calls, "broken"
                i = _skip(s, i + 1)
        i = _skip(s, i)
        if i == len(s):
            return calls, "open"
        if s[i] == "]":
            return calls, "closed"
        if s[i] != ",":
            return calls, "broken"
        i = _skip(s, i + 1)


class RequiredCallsParser(ToolParser):
    """``tool_choice: "required"``: the answer is a JSON array of calls."""

    name = "forced_required"

    def __init__(self, tools: list[dict] | None):
        super().__init__(tools)
        self._text = ""
        self._started: list[int] = []  # per call started: argument characters sent
        self._content = False  # the text never began a call: it streams as content
        self._stopped = False  # the text broke after a call began: the stream says no more
        self._values = _Values()

    def extract(self, text: str) -> Extracted:
        body = text.strip(_WS)
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        calls, state = _scan_calls(body, _Values())
        ok = isinstance(value, list) and value and state == "closed" and \
            len(calls) == len(value) and all(
                isinstance(v, dict) and self.known(v.get("name")) and
                isinstance(v.get("parameters"), dict) for v in value)
        if not ok:
            return Extracted(content=text or None)
        return Extracted(calls=[ParsedCall(self.make_id(), v["name"], body[c[1]:c[2]])
                                for v, c in zip(value, calls, strict=True)])

    def feed(self, delta: str) -> StreamDelta:
        if self._content:
            return StreamDelta(content=delta)
        if self._stopped:
            return StreamDelta()
        self._text += delta
        calls, state = _scan_calls(self._text, self._values)
        out = StreamDelta()
        for index, (name, p_start, p_end) in enumerate(calls):
            if name is None:
                break  # its name is not complete yet: nothing after it can start either
            if index == len(self._started):
                if not self.known(name):
                    state = "broken"
                    break
                self._started.append(0)
                out.calls.append(CallDelta(index, self.make_id(), name, ""))
            if p_start is None or self._text[p_start] != "{":
                continue  # parameters not begun, or not an object: send no arguments
            stop = len(self._text) if p_end is None else p_end
            if stop > p_start + self._started[index]:
                out.calls.append(CallDelta(index, arguments=self._text[
                    p_start + self._started[index]:stop]))
                self._started[index] = stop - p_start
        if state == "broken":
            if self._started:
                self._stopped = True
            else:
                self._content = True
                return StreamDelta(content=self._text)
        return out

    def finish(self) -> StreamDelta:
        if not self._started and not self._content and self._text:
            return StreamDelta(content=self._text)  # no call ever began: all of it is content
        return StreamDelta()
