"""``qwen3``: Qwen3's thinking, which the model opens itself or not at all.

Why this module exists: Qwen3 writes ``<think>`` as its first token when it thinks and nothing
of the kind when the chat template turned thinking off (``enable_thinking: false``), so a
response that does not begin with ``<think>`` has no reasoning and is all content, and the
stream knows that as soon as its first characters cannot begin ``<think>`` (``ended`` turns
True then, so a tool parser may start reading at once). An opened ``<think>`` that never closes
is reasoning, cut short by the budget. The rules are in ``basic_parsers``.

>>> Qwen3ReasoningParser().split("<think>plan</think>answer")
('plan', 'answer')
>>> Qwen3ReasoningParser().split("answer")
(None, 'answer')
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.reasoning.basic_parsers import BaseThinkingReasoningParser


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    name = "qwen3"
    implicit_start = False
