"""A forced tool call as a grammar: ``tool_choice`` ``"required"`` or a named function (Day 79).

Why this module exists: with ``tool_choice: "required"`` or ``{"type": "function", "function":
{"name": ...}}`` the client does not ask the model whether to call a tool; it demands a call,
so the server must make sure one comes out, with a known name and arguments valid against that
function's parameters. vLLM does it the way structured outputs do, with a JSON schema over the
output (``_get_json_schema_from_tool``): for ``"required"`` an array of ``{"name",
"parameters"}`` objects, one shape per tool, at least one item; for a named function the
function's parameters schema itself. This module turns a request's tools into that spec, a
``StructuredOutputsParams`` the engine already knows how to enforce.

The schema is compiled strictly (every object with ``properties`` and nothing said of
``additionalProperties`` is closed), so the model cannot add keys the function does not take
and a complete object can end. ``parallel=False`` (``parallel_tool_calls: false``) caps the
array at one call.

A thinking model must be let think before it calls: with a reasoning parser's markers
(``think=(start, end, implicit_start)``) the spec is a Lark grammar whose thinking part is free
text up to ``end``, then at most ``MAX_GAP`` spaces and newlines, then the JSON. When
``implicit_start`` (the chat template wrote ``start``) the thinking is mandatory and its
``start`` optional; otherwise the whole thinking is optional, as a model with thinking off
writes none. The thinking has no length limit of its own: a model that never writes ``end``
thinks until ``max_tokens`` and makes no call (the response is then all reasoning).

May import: ``nanoserve.structured.params`` (plain dicts in, a spec out).

>>> forced_call_spec([{"name": "f", "parameters": None}], "f", parallel=True).json
{'type': 'object', 'properties': {}}
"""

from __future__ import annotations

import json

from nanoserve.structured.params import StructuredOutputsParams

EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function that takes nothing
# spaces and newlines allowed between the thinking and the call: Qwen3 and R1 write "\n\n";
# an unbounded gap lets a small model spend its whole budget on whitespace (nanoserve-tiny did)
MAX_GAP = 4


def parameters_schema(tool: dict) -> dict:
    """A tool's parameters schema; a tool without one takes an empty object."""
    return tool.get("parameters") or dict(EMPTY_PARAMETERS)


def required_schema(tools: list[dict], parallel: bool) -> dict:
    """``tool_choice: "required"``: a non-empty array of calls, each one tool's shape
    (``{"name": NAME, "parameters": ARGS}``); one call at most when not ``parallel``."""
    schema: dict = {"type": "array", "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    schema["items"] = {"anyOf": [
        {"type": "object",
         "properties": {"name": {"const": t["name"]}, "parameters": parameters_schema(t)},
         "required": ["name", "parameters"]}
        for t in tools]}
    return schema


def call_schema(tools: list[dict], choice: str) -> dict:
    """The schema the call's JSON must follow: ``"required"``'s array, or the named function's
    parameters. A name not among ``tools`` is a ``ValueError`` (the server checks it first)."""
    if choice == "required":
        return required_schema(tools, parallel=True)
    for t in tools:
        if t["name"] == choice:
            return parameters_schema(t)
    raise ValueError(f"tool_choice names {choice!r}, which is not among the tools")


def forced_call_spec(tools: list[dict], choice: str | dict, parallel: bool,
                     think: tuple[str, str, bool] | None = None) -> StructuredOutputsParams:
    """The spec that forces the call. ``tools``: function dicts (``name``, ``description``,
    ``parameters``); ``choice``: ``"required"``, a function's name, or OpenAI's named-choice
    object; ``think``: a reasoning parser's ``(start, end, implicit_start)`` or ``None``."""
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        choice = choice.get("function", choice)["name"]
    schema = required_schema(tools, parallel) if choice == "required" \
        else call_schema(tools, choice)
    if think is None:
        return StructuredOutputsParams(json=schema, strict=True)
    return StructuredOutputsParams(grammar=think_then_call_lark(schema, *think))


def think_then_call_lark(schema: dict, start: str, end: str, implicit_start: bool) -> str:
    """llguidance Lark: a thinking span (free text up to ``end``), then the call's JSON under
    the strictly closed ``schema``, compact like structured outputs' JSON (no free whitespace
    inside it: ``x-guidance.whitespace_flexible`` false)."""
    closed = StructuredOutputsParams(json=schema, strict=True).schema()
    closed = {**closed, "x-guidance": {"whitespace_flexible": False}}
    think = f"{json.dumps(start)}? text" if implicit_start else f"{json.dumps(start)} text"
    return "\n".join([
        "start: think call" if implicit_start else "start: think? call",
        f"think: {think}",
        f"text[stop={json.dumps(end)}]: /(.|\\n)*/",
        f"call: /[ \\n]{{0,{MAX_GAP}}}/ %json {json.dumps(closed)}",
    ]) + "\n"
