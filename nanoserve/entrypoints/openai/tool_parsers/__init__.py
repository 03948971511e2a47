"""Tool-call parsers (Day 80): a model's text in, OpenAI's ``tool_calls`` out.

Why this package exists: with ``tool_choice: "auto"`` the model decides whether to call a tool,
and it says so in its own format, learned in training: Hermes' ``<tool_call>{...}</tool_call>``
(Qwen2.5, Qwen3), Llama 3's bare JSON object with ``parameters``, Mistral's ``[TOOL_CALLS]``.
The server did not generate that format under a grammar, so it must read it as it arrives,
token by token, and decide what is a call and what is text. One parser per format, one file
each, behind ``TOOL_PARSERS`` (``--tool-call-parser``, vLLM's names). ``forced.py`` reads the
output of a forced call (``tool_choice: "required"`` or a named function), which the grammar of
``nanoserve.structured.tools`` made, in the same interface.

May import: ``nanoserve.entrypoints.openai.protocol`` only (a parser is pure text handling).
"""

from __future__ import annotations

import importlib

# --tool-call-parser name -> "module:Class" under this package (imported when chosen)
TOOL_PARSERS: dict[str, str] = {
    "hermes": "hermes:HermesToolParser",
    "llama3_json": "llama3_json:Llama3JsonToolParser",
    "mistral": "mistral:MistralToolParser",
}


def tool_parser_class(name: str):
    """The parser class registered as ``name``; an unknown name is a ``ValueError`` listing
    the known ones."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of "
                         f"{', '.join(sorted(TOOL_PARSERS))}")
    module, cls = TOOL_PARSERS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
