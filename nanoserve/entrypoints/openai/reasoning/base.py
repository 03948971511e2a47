"""``ReasoningParser``: split a response into its thinking and its answer, whole or streamed.

Why this module exists: the split must come out the same whether the response is read at once
(``split``) or as deltas cut anywhere (``feed`` per text delta, then ``finish``), including a
``</think>`` cut into ``</th`` and ``ink>``: the stream's reasoning deltas joined equal the
whole response's ``reasoning``, its content deltas joined equal ``content``. ``ended`` says
whether the thinking is over, which is when a tool parser may start reading (tool calls are
parsed only after the reasoning ends), and ``start``/``end`` are the markers a forced call's
grammar lets the model write before the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(slots=True)
class ReasoningDelta:
    """What one ``feed`` (or ``finish``) releases: thinking text and answer text."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ReasoningParser:
    """Base class. One instance reads one choice. ``start`` and ``end`` are the markers."""

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    # True: the thinking may begin without ``start`` (the chat template wrote it into the
    # prompt), so text before ``end`` is thinking and a response with no ``end`` is all
    # thinking (DeepSeek-R1). False: no ``start`` and no ``end`` means no thinking (Qwen3 with
    # enable_thinking off). A forced call's grammar follows the same rule.
    implicit_start: ClassVar[bool] = False

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole response -> ``(reasoning, content)``; ``None`` where there is none."""
        raise NotImplementedError

    def feed(self, delta: str) -> ReasoningDelta:
        raise NotImplementedError

    def finish(self) -> ReasoningDelta:
        """The end of the stream: release what was held back (a partial marker)."""
        raise NotImplementedError

    @property
    def ended(self) -> bool:
        """Whether the stream has passed the end of the thinking (content may follow)."""
        raise NotImplementedError
