"""Split a thinking model's ``<think>...</think>`` from its answer, whole and streamed.

Two families differ in one place: where the thinking starts. Qwen3 writes ``<think>`` itself,
so thinking is there only when the response opens with it. The DeepSeek-R1 distills have it
written for them by the chat template, so a response begins inside the thinking whether or
not it repeats the marker (``implicit_start``), and a response that never closes it is all
thinking. In both, ``</think>`` ends the thinking and what follows is the answer.

The stream holds back at most a marker's length less one character: at the start, a text that
could still become ``<think>``; inside the thinking, a tail that could still become
``</think>``. Its reasoning pieces joined are the whole split's reasoning, its content pieces
the whole split's content, wherever the cuts fall.
"""

from __future__ import annotations

from .holdback import split_safe

START, END = "<think>", "</think>"


def split(text: str, implicit_start: bool) -> tuple[str | None, str | None]:
    """A whole response -> (reasoning, content), ``None`` where there is none."""
    if text.startswith(START):
        text = text[len(START):]
    elif not implicit_start:
        return None, text or None
    reasoning, marker, content = text.partition(END)
    return reasoning or None, (content if marker else "") or None


class ThinkStream:
    """One choice's stream: ``feed(delta) -> (reasoning, content)`` per delta, then
    ``finish()``. ``state`` is "opening" (is this ``<think>``?), "thinking" or "answering"."""

    def __init__(self, implicit_start: bool):
        self.implicit_start = implicit_start
        self.state = "opening"
        self.buf = ""

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        reasoning = content = ""
        if self.state == "opening":
            if START.startswith(self.buf):  # "<thi": could still be the marker
                return "", ""
            opened = self.buf.startswith(START)
            if opened or self.implicit_start:
                self.state = "thinking"
                self.buf = self.buf[len(START):] if opened else self.buf
            else:
                self.state = "answering"
        if self.state == "thinking":
            before, marker, after = self.buf.partition(END)
            if marker:
                self.state, self.buf = "answering", after
                reasoning = before
            else:
                reasoning, self.buf = split_safe(self.buf, END)
        if self.state == "answering":
            content, self.buf = self.buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The stream is over: a held tail is thinking if the thinking was open, else answer."""
        rest, self.buf = self.buf, ""
        thinking = self.state == "thinking" or (self.state == "opening" and self.implicit_start)
        return (rest, "") if thinking else ("", rest)
