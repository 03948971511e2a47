"""Mistral's format (``--tool-call-parser mistral``): calls after the ``[TOOL_CALLS]`` token.

Why this module exists: Mistral's models announce calls with a special token, in one of two
layouts, depending on the tokenizer version they were trained with. Before v11, one JSON array
of call objects:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}},
                 {"name": "get_time", "arguments": {}}]

From v11 on, each call is the token, the name, ``[ARGS]`` (absent in some templates) and the
arguments object:

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Both read as two calls. Mistral's validator wants call ids of exactly nine letters and digits,
so ``make_id`` makes those instead of OpenAI's ``call_...``.

What is what:
- Text before the first ``[TOOL_CALLS]`` is content, as written.
- After ``[TOOL_CALLS]`` (and optional whitespace) comes a JSON array of call objects (each with
  a string ``name`` naming a known tool and an object ``arguments``, other keys ignored), or a
  single such object, or a name (letters, digits, ``_``, ``-``, ``.``; at most 64) followed by
  an optional ``[ARGS]`` and the arguments object. The arguments are the object's text as
  written.
- After a call group (the array's ``]``, or the object), text is ordinary text again up to the
  next ``[TOOL_CALLS]``. When the response made a call, a stretch of whitespace alone between
  calls (or before the first, or after the last) is dropped.
- What is not a call is content from the end of the last call, or from the ``[TOOL_CALLS]``
  if the group's first call is the one that fails (broken JSON, an unknown name, arguments
  not an object, an array that is empty or not closed, a body cut off at the end); reading
  goes on as text up to the next ``[TOOL_CALLS]``. Calls before the failure in the same array
  stand.
- Streaming: see ``call_reader``. By default a call goes out only once its whole object has
  been judged, so the stream reads exactly as the whole text does; with ``early=True`` a call
  whose name went out and whose body then breaks keeps the arguments that went out, and the
  rest of the text is content.
"""

from __future__ import annotations

import string

from nanoserve.entrypoints.openai.tool_parsers.base import random_id
from nanoserve.entrypoints.openai.tool_parsers.call_reader import (
    BROKEN,
    DONE,
    WAIT,
    ObjectCallReader,
    StreamingToolParser,
)
from nanoserve.entrypoints.openai.tool_parsers.json_scan import held, skip_ws

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
NAME_LIMIT = 64


class MistralToolParser(StreamingToolParser):
    """``[TOOL_CALLS][{...}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}``, repeated."""

    name = "mistral"

    def __init__(self, tools: list[dict] | None = None, early: bool = False):
        super().__init__(tools, early)
        self.state = "text"   # text | mark | name | item | sep | call
        self.after = "text"   # the state after the call being read

    def make_id(self) -> str:
        return random_id(string.ascii_letters + string.digits, 9)

    def _step(self, final: bool) -> bool:
        buf, state = self.buf, self.state
        if state == "text":
            k = buf.find(MARK)
            if k >= 0:
                self.text(buf[:k])
                self.buf, self.state = buf[k:], "mark"
                return True
            keep = 0 if final else held(buf, MARK)
            self.text(buf[:len(buf) - keep])
            self.buf = buf[len(buf) - keep:]
            return False
        if state == "call":
            kind, at = self.read(final)
            if kind == WAIT:
                return False
            if kind == DONE:
                self.buf, self.state = buf[at:], self.after
            elif kind == BROKEN:
                return self._broken()
            return True                # FAILED: the rest is content (``stopped``)
        if state == "sep":             # after an array item: "," and the next, or "]"
            j = skip_ws(buf, 0)
            if j < len(buf) and buf[j] == ",":
                return self._object(skip_ws(buf, j + 1), "sep", final)
            if j < len(buf) and buf[j] == "]":
                self.buf, self.state = buf[j + 1:], "text"
                return True
            if j == len(buf) and not final:
                return False
            return self._broken()
        j = skip_ws(buf, len(MARK))     # mark: buf starts with the marker
        if state == "item":
            return self._object(j + 1, "sep", final)
        if j == len(buf):
            return self._broken() if final else False
        if buf[j] == "[":
            self.state = "item"
            return True
        if buf[j] == "{":
            return self._object(j, "text", final)
        return self._name(j, final)

    def _object(self, j: int, after: str, final: bool) -> bool:
        """A call object should start at ``buf[j]`` (after whitespace)."""
        j = skip_ws(self.buf, j)
        if j == len(self.buf):
            return self._broken() if final else False
        if self.buf[j] != "{":
            return self._broken()
        self.reader, self.state, self.after = ObjectCallReader(self, j), "call", after
        return True

    def _name(self, j: int, final: bool) -> bool:
        """v11: ``name[ARGS]{...}`` or ``name{...}`` from ``buf[j]``."""
        buf = self.buf
        k = j
        while k < len(buf) and k - j < NAME_LIMIT and buf[k] in NAME_CHARS:
            k += 1
        if k - j == NAME_LIMIT or (k == len(buf) and final):
            return self._broken()
        if k == len(buf):
            return False
        a = k
        if buf.startswith(ARGS, k):
            a = skip_ws(buf, k + len(ARGS))
            if a == len(buf):
                return self._broken() if final else False
        elif ARGS.startswith(buf[k:]):
            return self._broken() if final else False
        if k == j or buf[a] != "{":
            return self._broken()
        self.reader = ObjectCallReader(self, a, name=buf[j:k])
        self.state, self.after = "call", "text"
        return True

    def _broken(self) -> bool:
        """Not a call: content from the start of the buffer (the marker, or the end of the
        last call); read on as text."""
        self.as_text(0)
        self.state = "text"
        return True
