"""Day 79 snapshot (frozen): ``tool_choice`` as the JSON schema a forced call must match, and
the text a forced call wrote read back as calls.

``required`` is an array of calls, each a ``{"name", "parameters"}`` object that is one of the
tools: the name a constant, the parameters that tool's schema (vLLM's shape), its ``$defs``
lifted to the array's root. A named
function is its parameters schema alone, since the name is already known. ``none`` and
``auto`` force nothing. Every object the schema leaves open is closed (Day 67's ``closed``).

>>> tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}]
>>> s = forced_call_schema(tools, "required", parallel_tool_calls=False)
>>> s["minItems"], s["maxItems"], s["items"]["anyOf"][0]["properties"]["name"]
(1, 1, {'const': 'f'})
>>> forced_call_schema(tools, {"type": "function", "function": {"name": "f"}})
{'type': 'object', 'properties': {'x': {}}, 'additionalProperties': False}
>>> read_forced('[{"name":"f","parameters":{"x":1}}]', "required")
[('f', '{"x":1}')]
>>> read_forced('[{"name": "f", "parameters": {"x": 0.50}}, {"name":"f","parameters":{}}]',
...             "required")
[('f', '{"x": 0.50}'), ('f', '{}')]
"""

from __future__ import annotations

import json

from chapters.day67_structured_outputs.snapshot.mask import closed

NO_PARAMETERS = {"type": "object", "properties": {}}  # a tool that declares none takes {}
GAP = 4  # spaces and newlines allowed between the thought and the call


def parameters(tool: dict) -> dict:
    return tool.get("parameters") or NO_PARAMETERS


def call_branch(tool: dict) -> dict:
    """One call to ``tool``: its name, and arguments that match its schema."""
    return {"type": "object",
            "properties": {"name": {"const": tool["name"]}, "parameters": parameters(tool)},
            "required": ["name", "parameters"]}


def required_schema(tools: list[dict], parallel_tool_calls: bool = True) -> dict:
    """At least one call (at most one when parallel calls are off), each to one of ``tools``.
    A ``$ref`` to ``#/$defs/...`` points at the root of the document it sits in, which here is
    the array, not the tool's schema: so each tool's ``$defs`` move up to the array (as vLLM
    does), and two tools that give one name two meanings are a ``ValueError``."""
    defs, branches = {}, []
    for t in tools:
        own = dict(parameters(t))
        for name, body in own.pop("$defs", {}).items():
            if defs.setdefault(name, body) != body:
                raise ValueError(f"tools: two tools define $defs/{name} differently")
        branches.append(call_branch({**t, "parameters": own}))
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def chosen(tool_choice) -> str | None:
    """The named function's name, or None for the strings."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def forced_call_schema(tools: list[dict], tool_choice, parallel_tool_calls: bool = True):
    """The closed schema the output must match, or None where nothing is forced."""
    if not tools or tool_choice in (None, "none", "auto"):
        return None
    if tool_choice == "required":
        return closed(required_schema(tools, parallel_tool_calls))
    name = chosen(tool_choice)
    tool = next((t for t in tools if t["name"] == name), None)
    if tool is None:
        raise ValueError(f"tool_choice names {name!r}, which is not in tools")
    return closed(parameters(tool))


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _members(text: str, i: int):
    """``(key, value start, value end)`` for each member of the object at ``text[i]``; the
    value's text is ``text[start:end]``, exactly as written."""
    decode, i = json.JSONDecoder().raw_decode, _skip(text, i + 1)  # past "{"
    while text[i] != "}":
        key, i = decode(text, i)
        start = _skip(text, _skip(text, i) + 1)  # past ":"
        _, end = decode(text, start)
        yield key, start, end
        i = _skip(text, end)
        i = _skip(text, i + 1) if text[i] == "," else i


def read_forced(text: str, tool_choice) -> list[tuple[str, str]]:
    """The calls a forced output holds, as ``(name, arguments)``, the arguments being the JSON
    text of the object exactly as the model wrote it (never written back out: ``0.50`` stays
    ``0.50``). A named call's whole text is its arguments; a required output is the array, and
    each element's ``parameters`` is sliced out of it."""
    json.loads(text)  # the grammar made it whole; a cut-off output raises here
    name = chosen(tool_choice)
    if name is not None:
        return [(name, text.strip())]
    calls, decode, i = [], json.JSONDecoder().raw_decode, _skip(text, _skip(text, 0) + 1)
    while text[i] != "]":
        element = {k: (a, b) for k, a, b in _members(text, i)}
        (a, b), (c, d) = element["name"], element["parameters"]
        calls.append((json.loads(text[a:b]), text[c:d]))
        i = _skip(text, decode(text, i)[1])
        i = _skip(text, i + 1) if text[i] == "," else i
    return calls


def think_then_call(schema: dict, start: str, end: str, implicit_start: bool) -> str:
    """llguidance's Lark for a thinking model: free text up to the first ``end``, at most
    ``GAP`` spaces and newlines, then the call's JSON under ``schema`` (already closed). Where
    the template wrote ``start`` itself (``implicit_start``), the thought is owed and its
    ``start`` optional; otherwise a model with thinking off may begin with the call."""
    schema = {**schema, "x-guidance": {"whitespace_flexible": False}}  # compact, as Day 67
    opener = json.dumps(start) + ("?" if implicit_start else "")
    return "\n".join([
        "start: thought call" if implicit_start else "start: thought? call",
        f"thought: {opener} text",
        f"text[stop={json.dumps(end)}]: /(.|\\n)*/",
        f"call: /[ \\n]{{0,{GAP}}}/ %json {json.dumps(schema)}",
    ]) + "\n"
