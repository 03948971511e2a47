"""Reasoning parsers (Day 80): a thinking model's ``<think>...</think>`` split from its answer.

Why this package exists: Qwen3 and the DeepSeek-R1 distills write their chain of thought
before the answer, between ``<think>`` and ``</think>``. A client wants the answer as
``content`` and the thinking apart, in ``reasoning`` (and ``reasoning_content``, vLLM's older
name for the same text). The formats differ in one detail that matters: where the thinking
starts when the model never writes ``<think>`` (the chat template may have written it), and
what an unfinished think means. One parser per format, behind ``REASONING_PARSERS``
(``--reasoning-parser``, vLLM's names).

May import: nothing of nanoserve's (pure text handling).
"""

from __future__ import annotations

import importlib

# --reasoning-parser name -> "module:Class" under this package
REASONING_PARSERS: dict[str, str] = {
    "qwen3": "qwen3:Qwen3ReasoningParser",
    "deepseek_r1": "deepseek_r1:DeepSeekR1ReasoningParser",
}


def reasoning_parser_class(name: str):
    """The parser class registered as ``name``; an unknown name is a ``ValueError``."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of "
                         f"{', '.join(sorted(REASONING_PARSERS))}")
    module, cls = REASONING_PARSERS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
