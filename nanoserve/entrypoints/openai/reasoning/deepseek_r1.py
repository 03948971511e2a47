"""``deepseek_r1``: DeepSeek-R1's thinking, which begins in the prompt.

Why this module exists: DeepSeek-R1's chat template ends the prompt with ``<think>\\n``, so the
model's output starts inside the thinking and often never writes ``<think>`` itself. Text
before ``</think>`` is reasoning (an opening ``<think>`` the model did write is dropped), text
after it is content, and a response with no ``</think>`` at all is all reasoning: the model
never finished thinking. The rules are in ``basic_parsers``.

>>> DeepSeekR1ReasoningParser().split("plan</think>answer")
('plan', 'answer')
>>> DeepSeekR1ReasoningParser().split("still thinking")
('still thinking', None)
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.reasoning.basic_parsers import BaseThinkingReasoningParser


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    name = "deepseek_r1"
    implicit_start = True
