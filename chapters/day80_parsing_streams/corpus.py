"""Day 80's corpus: responses written by hand in each model's trained format, valid and broken.

Every case is a whole response as a model might write it, with the class the chapter expects it
to fall in: ``text`` (no call at all), ``call`` (one or more calls that read), or one of the
malformed classes, ``broken JSON``, ``unknown name`` and ``truncated``, which must all come out
as plain content. The tools the request offered are ``TOOLS``; a name outside them is unknown.
The reasoning cases are shared by both reasoning parsers, which read them differently.
"""

from __future__ import annotations

from dataclasses import dataclass

TOOLS = [
    {"name": "get_weather", "description": "The weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}},
    {"name": "search", "description": "Search the web.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
]
NAMES = {t["name"] for t in TOOLS}
MALFORMED = ("broken JSON", "unknown name", "truncated")


@dataclass(frozen=True)
class Case:
    label: str
    text: str
    kind: str  # "text", "call", or one of MALFORMED


def _hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


PARIS = '{"city": "Paris", "unit": "celsius"}'
TRICKY = '{"query": "why does \\"}\\" close {this}? caf\\u00e9 or café"}'

HERMES = [
    Case("plain answer", "The capital of France is Paris.", "text"),
    Case("angle brackets", "If a < b then <b>b</b> wins; <tool_call without its end is text.",
         "text"),
    Case("one call", _hermes(f'{{"name": "get_weather", "arguments": {PARIS}}}'), "call"),
    Case("text, then a call", "Let me look that up.\n"
         + _hermes('{"name": "search", "arguments": {"query": "nanoserve"}}'), "call"),
    Case("two calls", _hermes('{"name": "get_weather", "arguments": {"city": "Paris"}}') + "\n"
         + _hermes('{"name": "get_weather", "arguments": {"city": "Tokyo"}}'), "call"),
    Case("quotes and braces in a string", _hermes(f'{{"name": "search", "arguments": {TRICKY}}}'),
         "call"),
    Case("empty arguments", _hermes('{"name": "search", "arguments": {}}'), "call"),
    Case("trailing comma", _hermes('{"name": "get_weather", "arguments": {"city": "Paris",}}'),
         "broken JSON"),
    Case("single quotes", _hermes("{'name': 'get_weather', 'arguments': {'city': 'Paris'}}"),
         "broken JSON"),
    Case("unknown name", _hermes('{"name": "book_flight", "arguments": {"to": "Oslo"}}'),
         "unknown name"),
    Case("cut inside the arguments",
         'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "truncated"),
    Case("cut inside the marker", "Checking the weather now <tool_ca", "truncated"),
]

LLAMA3 = [
    Case("plain answer", "The capital of France is Paris.", "text"),
    Case("braces in prose", "Sets are written {1, 2}; a dict is {\"a\": 1}.", "text"),
    Case("an object that is no call", '{"note": "a JSON object, not a call"} opens this.', "text"),
    Case("one call", f'{{"name": "get_weather", "parameters": {PARIS}}}', "call"),
    Case("python tag", '<|python_tag|>{"name": "search", "parameters": {"query": "nanoserve"}}',
         "call"),
    Case("two calls", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_weather", "parameters": {"city": "Tokyo"}}', "call"),
    Case("quotes and braces in a string", f'{{"name": "search", "parameters": {TRICKY}}}', "call"),
    Case("empty parameters", '{"name": "search", "parameters": {}}', "call"),
    Case("unquoted value", '{"name": "get_weather", "parameters": {"city": Paris}}',
         "broken JSON"),
    Case("trailing comma", '{"name": "search", "parameters": {"query": "x",}}', "broken JSON"),
    Case("unknown name", '{"name": "book_flight", "parameters": {"to": "Oslo"}}', "unknown name"),
    Case("cut inside the parameters", '{"name": "get_weather", "parameters": {"city": "Par',
         "truncated"),
]

MISTRAL = [
    Case("plain answer", "The capital of France is Paris.", "text"),
    Case("brackets in prose", "See [1] and [TOOL notes]; [TOOL_CALLS without its bracket is text.",
         "text"),
    Case("one call, array", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {PARIS}}}]',
         "call"),
    Case("two calls, array", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}},'
         ' {"name": "search", "arguments": {"query": "Paris"}}]', "call"),
    Case("text, then a call, array", 'Let me check. [TOOL_CALLS][{"name": "search", '
         '"arguments": {"query": "nanoserve"}}]', "call"),
    Case("one call, [ARGS]", f"[TOOL_CALLS]get_weather[ARGS]{PARIS}", "call"),
    Case("two calls, [ARGS]", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
         '[TOOL_CALLS]search[ARGS]{"query": "Paris"}', "call"),
    Case("quotes and braces, [ARGS]", f"[TOOL_CALLS]search[ARGS]{TRICKY}", "call"),
    Case("trailing comma, array",
         '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris",}}]', "broken JSON"),
    Case("unquoted value, [ARGS]", "[TOOL_CALLS]get_weather[ARGS]{\"city\": Paris}",
         "broken JSON"),
    Case("unknown name, array", '[TOOL_CALLS][{"name": "book_flight", "arguments": {}}]',
         "unknown name"),
    Case("unknown name, [ARGS]", '[TOOL_CALLS]book_flight[ARGS]{"to": "Oslo"}', "unknown name"),
    Case("cut inside the array", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci',
         "truncated"),
    Case("cut inside [ARGS]", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', "truncated"),
]

FORMATS = {"hermes": HERMES, "llama3_json": LLAMA3, "mistral": MISTRAL}
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}

REASONING = [
    Case("thinking, then the answer",
         "<think>\nThe user wants 2 + 2, which is 4.\n</think>\n\nThe answer is 4.", "text"),
    Case("no opening marker", "The user wants 2 + 2, which is 4.\n</think>\n\nThe answer is 4.",
         "text"),
    Case("no markers at all", "The answer is 4.", "text"),
    Case("thinking never closed", "<think>\nThe user wants 2 + 2, and I am still", "truncated"),
    Case("empty thinking", "<think>\n\n</think>\n\nThe answer is 4.", "text"),
    Case("a near miss inside", "<think>\nIs </thin k> a marker? No; </think not either.\n"
         "</think>\nNo.", "text"),
    Case("cut inside the closing marker", "<think>\nAlmost done.</thi", "truncated"),
]
