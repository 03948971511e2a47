"""``BaseThinkingReasoningParser``: the ``<think>...</think>`` split both formats share.

Why this module exists: Qwen3 and DeepSeek-R1 differ in one rule only, what text means when the
model never wrote the opening ``<think>`` (``implicit_start``), and everything else (finding
``</think>``, holding back a marker cut across deltas, making the stream agree with the whole
response for every cut) is the same machine. vLLM calls its shared base the same name.

The rules, for a response ``text`` (``start``/``end`` are ``<think>``/``</think>``):

- ``start`` counts only at the very beginning of the response (character 0); elsewhere it is
  text. vLLM partitions on the first ``start`` anywhere, which drops the text before it; a
  stream cannot take back text it has sent, so we read the opening marker at the start only.
- After an opening ``start`` (or at once, when ``implicit_start``) the thinking runs to the
  first ``end``; the text after ``end`` is the content, verbatim. vLLM keeps the newlines the
  model writes after ``</think>`` (``partition``), so ``"</think>\\n\\nHi"`` has content
  ``"\\n\\nHi"`` here too; a client that wants them gone strips them.
- A thinking that never closes (the budget ran out mid-thought) is all reasoning, content
  ``None``: vLLM's current parsers return ``(model_output, None)`` for a truncated think, and it
  is the only rule a stream can follow without holding the whole thought back. (vLLM's older
  Qwen3 parser returned an unclosed ``<think>`` as content whole, while its stream had already
  sent the same text as reasoning: the two disagreed.)
- No opening ``start``: with ``implicit_start`` (DeepSeek-R1, whose template wrote ``<think>``
  into the prompt) the response begins inside the thinking, so the rules above apply from
  character 0 and a response with no ``end`` is all reasoning. Without it (Qwen3, which writes
  no think block when ``enable_thinking`` is off) there is no thinking: the whole response is
  content, a stray ``</think>`` included.
- Empty parts are ``None`` (``"<think></think>"`` is ``(None, None)``).

Streaming (``feed``/``finish``) releases text as soon as its side is known and holds back only
what could still become a marker: a prefix of ``start`` at the very beginning, the longest tail
that is a proper prefix of ``end`` inside the thinking. The reasoning deltas joined equal
``split``'s reasoning and the content deltas joined equal its content, for every cut.
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.reasoning.base import ReasoningDelta, ReasoningParser

_START, _THINK, _CONTENT = "start", "think", "content"  # the stream's three states


def _partial_tail(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class BaseThinkingReasoningParser(ReasoningParser):
    """``<think>``/``</think>`` reasoning; subclasses set ``name`` and ``implicit_start``."""

    def __init__(self) -> None:
        self._state = _START
        self._held = ""  # text not yet released: a possible marker, cut by the delta

    def split(self, text: str) -> tuple[str | None, str | None]:
        if text.startswith(self.start):
            body = text[len(self.start):]
        elif self.implicit_start:
            body = text
        else:
            return None, text or None
        reasoning, found, content = body.partition(self.end)
        return reasoning or None, (content if found else "") or None

    @property
    def ended(self) -> bool:
        return self._state == _CONTENT

    def feed(self, delta: str) -> ReasoningDelta:
        out = ReasoningDelta()
        text, self._held = self._held + delta, ""
        if self._state == _START:
            if text.startswith(self.start):
                text, self._state = text[len(self.start):], _THINK
            elif self.start.startswith(text):  # "", "<", "<th", ...: still undecided
                self._held = text
                return out
            else:  # no opening marker: thinking from here (implicit) or no thinking at all
                self._state = _THINK if self.implicit_start else _CONTENT
        if self._state == _THINK:
            before, found, after = text.partition(self.end)
            if not found:
                keep = _partial_tail(text, self.end)
                self._held = text[len(text) - keep:] if keep else ""
                out.reasoning = text[:len(text) - keep]
                return out
            out.reasoning, text, self._state = before, after, _CONTENT
        out.content = text
        return out

    def finish(self) -> ReasoningDelta:
        """The held tail was no marker after all: a partial ``start`` is read as the split
        reads a response that does not begin with ``start``; a partial ``end`` is thinking."""
        held, self._held = self._held, ""
        if not held:
            return ReasoningDelta()
        if self._state == _START and not self.implicit_start:
            self._state = _CONTENT
            return ReasoningDelta(content=held)
        return ReasoningDelta(reasoning=held)
