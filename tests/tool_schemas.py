"""Eight tools, and what a test checks of a call to one, whole and streamed.

Why this module exists: the tool-calling tests on the shipped model
(``test_tool_calling_server.py``) and on each family's random checkpoint
(``test_tool_calling_families.py``) force calls to the same set of tools and hold the results to
the same rules: the arguments validate against the tool's schema with ``jsonschema`` (a
reference this project did not write), and a stream's deltas, joined, are the whole response.

The schemas cover what a forced call's grammar must enforce: nested objects, arrays with length
bounds, enums, integers with ranges, numbers on a grid, strings with patterns and lengths,
booleans, optional fields, and a tool with no parameters. Every one is bounded (strings and
arrays have maximum lengths, numbers a ``multipleOf``), so a random model, which writes
whatever the grammar lets it, must end its call.
"""

from __future__ import annotations

import json

import jsonschema


def fn(name: str, parameters: dict | None, description: str = "") -> dict:
    f = {"name": name, "description": description or f"the {name} tool"}
    if parameters is not None:
        f["parameters"] = parameters
    return {"type": "function", "function": f}


def obj(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required}


TOOLS = [
    fn("get_weather", obj({"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
                           "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"])),
    fn("book_flight", obj({
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "passengers": obj({"adults": {"type": "integer", "minimum": 1, "maximum": 9},
                           "children": {"type": "integer", "minimum": 0, "maximum": 9}},
                          ["adults"])}, ["origin", "destination", "passengers"])),
    fn("add_tags", obj({"tags": {"type": "array", "minItems": 1, "maxItems": 3,
                                 "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}}},
                       ["tags"])),
    fn("set_alarm", obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                         "minute": {"type": "integer", "minimum": 0, "maximum": 59},
                         "repeat": {"type": "boolean"}}, ["hour", "minute", "repeat"])),
    fn("search", obj({"query": {"type": "string", "minLength": 1, "maxLength": 16},
                      "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                      "exact": {"type": "boolean"}}, ["query"])),
    fn("get_time", None, "the time now: takes no arguments"),
    fn("rate", obj({"score": {"type": "number", "minimum": 0, "maximum": 5,
                              "multipleOf": 0.5},
                    "comment": {"type": "string", "maxLength": 12}}, ["score"])),
    fn("create_user", obj({
        "user": obj({"name": {"type": "string", "pattern": "^[A-Za-z]{1,10}$"},
                     "age": {"type": "integer", "minimum": 0, "maximum": 120},
                     "roles": {"type": "array", "maxItems": 2,
                               "items": {"enum": ["admin", "dev", "ops"]}}},
                    ["name", "age"]),
        "active": {"type": "boolean"}}, ["user", "active"])),
]
NAMES = [t["function"]["name"] for t in TOOLS]


def pick(*names: str) -> list[dict]:
    """The tools called ``names``, in that order. A request lists a few, not all eight: the
    chat templates write every tool's schema into the prompt (about 175 tokens each on the
    shipped model, whose context is 1024)."""
    return [next(t for t in TOOLS if t["function"]["name"] == n) for n in names]
MESSAGES = [{"role": "user", "content": "Use a tool."}]


def schema_of(name: str) -> dict:
    """The schema a call to ``name`` must satisfy: no parameters means an empty object."""
    f = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
    return f.get("parameters") or {"type": "object", "properties": {},
                                   "additionalProperties": False}


def valid(name: str, arguments: str) -> bool:
    """Whether ``arguments`` is a JSON object that validates against ``name``'s schema."""
    try:
        args = json.loads(arguments)
        jsonschema.validate(args, schema_of(name))
    except (ValueError, jsonschema.ValidationError):
        return False
    return isinstance(args, dict)


def whole(choice) -> dict:
    """A non-streamed choice as the fields a stream must reproduce (call ids aside)."""
    m = choice.message
    return {"content": m.content or None, "reasoning": getattr(m, "reasoning", None),
            "reasoning_content": getattr(m, "reasoning_content", None),
            "calls": [(c.function.name, c.function.arguments) for c in m.tool_calls or []],
            "finish_reason": choice.finish_reason}


def joined(chunks) -> dict:
    """A stream of one choice joined into ``whole``'s shape, checking OpenAI's delta shape on
    the way: a call's first delta has its index, id, type and name with empty arguments; later
    ones only the index and argument fragments; the finish reason comes once, last."""
    content, reasoning, reasoning_content = "", "", ""
    calls: dict[int, list[str]] = {}
    finish = []
    for ch in chunks:
        for c in ch.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning", None) or ""
            reasoning_content += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.type == "function" and tc.function.name, tc
                    assert tc.function.arguments == "", tc
                    calls[tc.index] = [tc.function.name, ""]
                else:
                    assert tc.id is None and tc.function.name is None, tc
                    calls[tc.index][1] += tc.function.arguments
            if c.finish_reason is not None:
                finish.append(c.finish_reason)
    assert len(finish) == 1, finish
    assert sorted(calls) == list(range(len(calls))), sorted(calls)
    return {"content": content or None, "reasoning": reasoning or None,
            "reasoning_content": reasoning_content or None,
            "calls": [tuple(calls[i]) for i in sorted(calls)], "finish_reason": finish[0]}


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}
