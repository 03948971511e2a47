"""Reading JSON that is still arriving: where a value ends, and whether a buffer can still grow
into what a parser waits for.

Why this module exists: a tool-call parser sees a model's text in pieces, and a call is a JSON
object inside it. ``json.loads`` answers only for whole text, so the parsers need three smaller
questions answered on a partial buffer, without reading it twice:

- ``Scanner``: where does the object (or array) that starts at ``i`` end? It tracks strings,
  escapes and the bracket stack, goes on from where it stopped when more text arrives, and says
  ``end`` (the index after the closing bracket) or ``bad`` (a closer that does not match).
  It does not check the rest of JSON's grammar: ``json.loads`` does that once the end is known.
- ``header``: does the buffer open with ``{"name": "<name>", "arguments": {``? Once it does, the
  name is complete and the arguments can stream; ``NEED`` while it cannot tell, ``SLOW`` when
  the object is laid out any other way (read whole, then judged).
- ``held``: how long a tail of the buffer could still become a marker such as ``<tool_call>``.

``read_call`` judges a whole call object: valid JSON, a ``name``, exactly one arguments key
holding an object, and where that object's text sits, so that the arguments are sliced from
what the model wrote and never re-serialised.
"""

from __future__ import annotations

import json
import re

WS = " \t\n\r"
NEED = "need"    # header: the buffer ends before the answer is known
SLOW = "slow"    # header: not the usual layout; read the object whole
HEADER_LIMIT = 512  # a header not decided within this many characters goes the slow way

_STRUCT = re.compile(r'[{}\[\]"]')
_IN_STRING = re.compile(r'["\\]')
_CLOSER = {"}": "{", "]": "["}
_DECODER = json.JSONDecoder()


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WS:
        i += 1
    return i


def held(text: str, marker: str) -> int:
    """The length of the longest tail of ``text`` that is a proper start of ``marker``: the
    part to hold back, since the next delta may complete the marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def string_end(s: str, i: int) -> int | None:
    """``s[i]`` is a ``"``: the index after the closing quote, ``None`` if not there yet."""
    j = i + 1
    while True:
        m = _IN_STRING.search(s, j)
        if m is None:
            return None
        if m.group() == '"':
            return m.end()
        j = m.end() + 1  # a backslash: skip the escaped character
        if j > len(s):
            return None


class Scanner:
    """Finds the end of the JSON object or array that starts at ``start``, fed a buffer that
    only grows (the same string, longer each time)."""

    __slots__ = ("pos", "stack", "in_string", "end", "bad")

    def __init__(self, start: int):
        self.pos = start                 # next index to read
        self.stack: list[str] = []       # open brackets
        self.in_string = False
        self.end: int | None = None      # index after the closing bracket
        self.bad: int | None = None      # index of a closer that does not match

    @property
    def done(self) -> bool:
        return self.end is not None or self.bad is not None

    def advance(self, s: str) -> None:
        i, n = self.pos, len(s)
        while i < n and not self.done:
            if self.in_string:
                m = _IN_STRING.search(s, i)
                if m is None:
                    i = n
                elif m.group() == "\\":
                    if m.end() >= n:     # the escaped character is not here yet
                        i = m.start()
                        break
                    i = m.end() + 1
                else:
                    self.in_string, i = False, m.end()
                continue
            m = _STRUCT.search(s, i)
            if m is None:
                i = n
                break
            c, i = m.group(), m.end()
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.stack.append(c)
            elif self.stack and self.stack[-1] == _CLOSER[c]:
                self.stack.pop()
                if not self.stack:
                    self.end = i
            else:
                self.bad = m.start()
        self.pos = i


def _lit(t: str, i: int, word: str) -> int | str:
    if t.startswith(word, i):
        return i + len(word)
    return NEED if word.startswith(t[i:]) else SLOW


def _string(t: str, i: int) -> tuple[str, int] | str:
    if i == len(t):
        return NEED
    if t[i] != '"':
        return SLOW
    e = string_end(t, i)
    if e is None:
        return NEED
    try:
        return json.loads(t[i:e]), e
    except ValueError:
        return SLOW


def header(s: str, start: int, keys: tuple[str, ...]) -> tuple[str, int] | str:
    """Read ``{"name": "<name>", "<key>": {`` at ``s[start]`` (any JSON whitespace between,
    ``<key>`` one of ``keys``): ``(name, index of the arguments' "{")``, or ``NEED``, or
    ``SLOW``. Decided by the first ``HEADER_LIMIT`` characters alone."""
    t = s[start:start + HEADER_LIMIT]
    i: int | str = _lit(t, 0, "{")
    name = None
    for step in ("name", ":", "value", ",", "key", ":", "{"):
        if isinstance(i, str):
            break
        i = skip_ws(t, i)
        if step in ("name", "value", "key"):
            got = _string(t, i)
            if isinstance(got, str):
                i = got
                break
            word, i = got
            if step == "value":
                name = word
            elif (step == "name" and word != "name") or (step == "key" and word not in keys):
                i = SLOW
        else:
            i = _lit(t, i, step)
    if isinstance(i, str):
        return SLOW if i == NEED and len(t) == HEADER_LIMIT else i
    return name, start + i - 1


def members(obj: str) -> dict[str, tuple[int, int]] | None:
    """Each top-level key of the JSON object text ``obj`` -> the span of its value's text (the
    last one when a key repeats, as ``json.loads`` keeps); ``None`` if ``obj`` is not one."""
    out: dict[str, tuple[int, int]] = {}
    try:
        i = skip_ws(obj, 1)
        while obj[i] != "}":
            key, i = _DECODER.raw_decode(obj, i)
            i = skip_ws(obj, i)
            if obj[i] != ":":
                return None
            a = skip_ws(obj, i + 1)
            _, b = _DECODER.raw_decode(obj, a)
            out[key] = (a, b)
            i = skip_ws(obj, b)
            if obj[i] == ",":
                i = skip_ws(obj, i + 1)
            elif obj[i] != "}":
                return None
    except (ValueError, IndexError):
        return None
    return out


def read_call(obj: str, keys: tuple[str, ...]) -> tuple[str, int, int] | None:
    """A whole call object's ``(name, start, end)``, ``obj[start:end]`` its arguments' text; or
    ``None``: not JSON, not an object, no string name, not exactly one of ``keys``, or
    arguments that are not an object."""
    try:
        value = json.loads(obj)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    present = [k for k in keys if k in value]
    if len(present) != 1 or not isinstance(value[present[0]], dict):
        return None
    spans = members(obj)
    if spans is None or present[0] not in spans:
        return None
    return (value["name"], *spans[present[0]])


def is_object(text: str) -> bool:
    """Whether ``text`` is exactly one JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
