"""Llama 3's JSON format (``--tool-call-parser llama3_json``): the answer is the call.

Why this module exists: Llama 3.1, 3.2 and 3.3, prompted with JSON tool definitions, call a
tool by answering with nothing but a JSON object, arguments under ``parameters``:

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

(optionally after ``<|python_tag|>``), which this parser turns into two calls and no content.
There is no marker: a response is read as calls only if it begins with ``{``.

What is what:
- After leading whitespace, and an optional ``<|python_tag|>`` with whitespace after it, the
  text must begin with ``{``, else the whole text is content exactly as written.
- A call is a JSON object with a string ``name`` naming a known tool and exactly one of
  ``parameters`` or ``arguments`` holding an object (other keys, such as ``"type":
  "function"``, are ignored). The arguments are that object's text as written.
- Calls are separated by whitespace and at most one ``;``. Separators, and the leading
  whitespace and ``<|python_tag|>`` before the first call, are dropped; so is whitespace and a
  ``;`` after the last call.
- The first thing that is not a call ends the reading: from the end of the last call (the
  separator included) to the end of the text, everything is content. So if the first object
  is not a valid call (broken JSON, an unknown name, ``parameters`` not an object, cut off at
  the end), the whole text is content, and a model that answers in plain JSON is answered as
  text.
- Streaming: see ``call_reader``. By default a call goes out only once its whole object has
  been judged, so the stream reads exactly as the whole text does; with ``early=True`` a call
  whose name went out and whose body then breaks keeps the arguments that went out, and the
  rest of the text is content.
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.tool_parsers.call_reader import (
    DONE,
    WAIT,
    ObjectCallReader,
    StreamingToolParser,
)
from nanoserve.entrypoints.openai.tool_parsers.json_scan import skip_ws

TAG = "<|python_tag|>"


class Llama3JsonToolParser(StreamingToolParser):
    """``{"name": ..., "parameters": {...}}``, several joined by ``;``."""

    name = "llama3_json"
    args_keys = ("parameters", "arguments")

    def __init__(self, tools: list[dict] | None = None, early: bool = False):
        super().__init__(tools, early)
        self.state = "start"  # start | call | sep

    def _step(self, final: bool) -> bool:
        buf = self.buf
        if self.state == "call":
            kind, at = self.read(final)
            if kind == WAIT:
                return False
            if kind == DONE:
                self.buf, self.state = buf[at:], "sep"
            else:
                self.stopped = True      # not a call: this text on is content
            return True
        if self.state == "start":
            j = skip_ws(buf, 0)
            if buf.startswith(TAG, j):
                j = skip_ws(buf, j + len(TAG))
            elif TAG.startswith(buf[j:]) and not final:
                return False
        else:                            # sep: after a call
            j = skip_ws(buf, 0)
            if j < len(buf) and buf[j] == ";":
                j = skip_ws(buf, j + 1)
            if j == len(buf) and final:  # only separators after the last call
                self.buf = ""
                return False
        if j == len(buf) and not final:
            return False
        if j < len(buf) and buf[j] == "{":
            self.reader, self.state = ObjectCallReader(self, j), "call"
        else:
            self.stopped = True
        return True
