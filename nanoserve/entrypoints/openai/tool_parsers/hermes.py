"""Hermes' format (``--tool-call-parser hermes``): each call a JSON object between markers.

Why this module exists: Hermes 2 Pro, Qwen2.5 and Qwen3 were trained to call a tool by writing

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

and this parser turns that into two calls with ``content`` "Let me look that up.\\n".

What is what:
- A call is ``<tool_call>``, optional whitespace, a JSON object with a string ``name`` naming
  a known tool and an object ``arguments`` (other keys are ignored), optional whitespace and
  ``</tool_call>``. The arguments are the object's text as written.
- A missing ``</tool_call>`` does not undo a complete, valid object: the call stands, and the
  text after the object is ordinary text.
- Everything else is content exactly as written, before, between and after calls, with one
  exception: when the response made a call, a stretch of whitespace alone between calls (or
  before the first, or after the last) is dropped.
- A ``<tool_call>`` that begins no valid call (broken JSON, ``arguments`` not an object, an
  unknown name, a body cut off at the end) is content, from its ``<`` on; reading goes on
  right after that ``<``, so a later valid call is still a call.
- Streaming: see ``call_reader``. By default a call goes out only once its whole object has
  been judged, so the stream reads exactly as the whole text does; with ``early=True`` a call
  whose name went out and whose body then breaks keeps the arguments that went out, and the
  rest of the text is content.
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.tool_parsers.call_reader import (
    BROKEN,
    DONE,
    WAIT,
    ObjectCallReader,
    StreamingToolParser,
)
from nanoserve.entrypoints.openai.tool_parsers.json_scan import held, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(StreamingToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or more."""

    name = "hermes"

    def __init__(self, tools: list[dict] | None = None, early: bool = False):
        super().__init__(tools, early)
        self.state = "text"   # text | open (buf starts with OPEN) | call | close

    def _step(self, final: bool) -> bool:
        buf = self.buf
        if self.state == "text":
            k = buf.find(OPEN)
            if k >= 0:
                self.text(buf[:k])
                self.buf, self.state = buf[k:], "open"
                return True
            keep = 0 if final else held(buf, OPEN)
            self.text(buf[:len(buf) - keep])
            self.buf = buf[len(buf) - keep:]
            return False
        if self.state == "open":
            j = skip_ws(buf, len(OPEN))
            if j == len(buf) and not final:
                return False
            if j < len(buf) and buf[j] == "{":
                self.reader, self.state = ObjectCallReader(self, j), "call"
            else:
                self.as_text(0)
                self.state = "text"
            return True
        if self.state == "call":
            kind, at = self.read(final)
            if kind == WAIT:
                return False
            if kind == DONE:
                self.buf, self.state = buf[at:], "close"
            elif kind == BROKEN:
                self.as_text(0)
                self.state = "text"
            return True
        # close: whitespace, then the closing marker; anything else is the next run's text
        j = skip_ws(buf, 0)
        rest = buf[j:]
        if rest.startswith(CLOSE):
            self.buf = rest[len(CLOSE):]
        elif CLOSE.startswith(rest) and not final:
            return False
        self.state = "text"
        return True
