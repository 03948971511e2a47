"""How much of a stream's tail to keep back: the longest end of the text that could still grow
into a marker.

A stream reader sees ``... <tool`` and cannot yet say whether those five characters are text
or the start of ``<tool_call>``. It must not send them as content (they may be a marker), and
it must not hold more than that (the reader would wait for nothing). The answer is the longest
suffix of the text that is a proper prefix of the marker: at most ``len(marker) - 1``
characters, and zero as soon as the tail cannot be one.
"""

from __future__ import annotations


def held(text: str, marker: str) -> int:
    """The number of characters at the end of ``text`` that could begin ``marker``.

    >>> held("the weather <tool", "<tool_call>")
    5
    >>> held("a < b", "<tool_call>"), held("<tool_call", "<tool_call>")
    (0, 10)
    """
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def split_safe(text: str, marker: str) -> tuple[str, str]:
    """``text`` without a marker in it -> (what may go out now, what must wait)."""
    k = held(text, marker)
    return text[:len(text) - k], text[len(text) - k:]
