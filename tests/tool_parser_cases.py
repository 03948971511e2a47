"""Model output written by hand to each tool-call format, with what it must read as.

Each ``Case``: the parser's registry name, the text, the calls (name, arguments text exactly as
written) and the content that ``extract`` must give. ``stream`` is set only where a stream must
differ from ``extract``: a call whose name went out before its body broke (see
``tool_parsers/call_reader.py``); it holds what every way of cutting that text must stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TOOLS = [{"name": n, "parameters": {"type": "object"}}
         for n in ("get_weather", "get_time", "search")]


@dataclass(frozen=True)
class Case:
    id: str
    parser: str
    text: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    content: str | None = None
    stream: tuple[list[tuple[str, str]], str | None] | None = None


def text_only(id: str, parser: str, text: str) -> Case:
    """Malformed or plain output: no calls, the whole text is content."""
    return Case(id, parser, text, [], text)


W = '{"city": "Paris"}'
NESTED = r'{"q": {"text": "a } b { c ] [", "n": [1, {"x": "]"}, []]}, "ok": true}'
ESCAPED = r'{"path": "C:\\dir\\", "say": "he said \"hi {\" to me", "tab": "\t"}'
UNICODE = '{"city": "Zürich", "sky": "🌧 雨", "esc": "\\u00e9\\ud83c\\udf27"}'

HERMES = [
    Case("single", "hermes",
         f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
         [("get_weather", W)]),
    Case("two_with_content", "hermes",
         f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n',
         [("get_weather", W), ("get_time", "{}")], "Let me check.\n"),
    Case("nested", "hermes", f'<tool_call>{{"name":"search","arguments":{NESTED}}}</tool_call>',
         [("search", NESTED)]),
    Case("escaped", "hermes", f'<tool_call> {{"name": "search", "arguments": {ESCAPED}}} '
         '</tool_call>', [("search", ESCAPED)]),
    Case("unicode", "hermes", f'<tool_call>{{"name": "get_weather", "arguments": {UNICODE}}}'
         '</tool_call>', [("get_weather", UNICODE)]),
    Case("marker_in_string", "hermes",
         '<tool_call>{"name": "search", "arguments": {"q": "</tool_call><tool_call>{"}}'
         '</tool_call>', [("search", '{"q": "</tool_call><tool_call>{"}')]),
    Case("empty_arguments", "hermes", '<tool_call>{"name": "get_time", "arguments": {}}'
         '</tool_call>', [("get_time", "{}")]),
    Case("arguments_first", "hermes",
         '<tool_call>{"arguments": {"a": 1}, "id": 7, "name": "get_time"}</tool_call>',
         [("get_time", '{"a": 1}')]),
    Case("text_after", "hermes",
         '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\nDone.',
         [("get_time", "{}")], "\nDone."),
    Case("no_closing_marker", "hermes", '<tool_call>{"name": "get_time", "arguments": {}}\n',
         [("get_time", "{}")]),
    Case("broken_then_good", "hermes",
         '<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n<tool_call>'
         '{"name": "get_time", "arguments": {}}</tool_call>',
         [("get_time", "{}")], '<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n'),
    text_only("plain", "hermes", "The weather in Paris is mild."),
    text_only("half_marker", "hermes", "I would use <tool_cal> or <tool_call"),
    text_only("only_whitespace", "hermes", "  \n"),
    Case("empty", "hermes", "", [], None),
    text_only("unknown_name", "hermes",
              '<tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call>'),
    text_only("not_json", "hermes", '<tool_call>get_weather(city="Paris")</tool_call>'),
    text_only("bare_name", "hermes",
              '<tool_call>{"name": get_weather, "arguments": {}}</tool_call>'),
    text_only("arguments_string", "hermes",
              '<tool_call>{"name": "get_weather", "arguments": "city=Paris"}</tool_call>'),
    text_only("arguments_array", "hermes",
              '<tool_call>{"name": "get_weather", "arguments": ["Paris"]}</tool_call>'),
    text_only("no_name", "hermes", '<tool_call>{"arguments": {}}</tool_call>'),
    text_only("name_not_string", "hermes", '<tool_call>{"name": 3, "arguments": {}}</tool_call>'),
    text_only("broken_unclosed", "hermes",
              'Sure <tool_call>{"name": "get_weather", "arguments": "oops'),
    text_only("cut_in_name", "hermes", '<tool_call>\n{"name": "get_wea'),
    Case("cut_in_arguments", "hermes",
         '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
         [], '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
         stream=([("get_weather", '{"city": "Par')], None)),
    Case("bracket_mismatch", "hermes",
         '<tool_call>{"name": "get_weather", "arguments": {"a": [1}}</tool_call> after',
         [], '<tool_call>{"name": "get_weather", "arguments": {"a": [1}}</tool_call> after',
         stream=([("get_weather", '{"a": [1')], "}}</tool_call> after")),
    Case("invalid_in_arguments", "hermes",
         '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>',
         [], '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>',
         stream=([("get_weather", '{"city": Paris}')], "}</tool_call>")),
    Case("outer_brace_missing", "hermes",
         '<tool_call>{"name": "get_time", "arguments": {}</tool_call>',
         [], '<tool_call>{"name": "get_time", "arguments": {}</tool_call>',
         stream=([("get_time", "{}")], "</tool_call>")),
]

LLAMA = [
    Case("single", "llama3_json", f'{{"name": "get_weather", "parameters": {W}}}',
         [("get_weather", W)]),
    Case("python_tag", "llama3_json",
         f'\n <|python_tag|> {{"name": "get_weather", "parameters": {W}}}\n',
         [("get_weather", W)]),
    Case("two", "llama3_json",
         f'{{"name": "get_weather", "parameters": {W}}}; {{"name": "get_time", '
         '"parameters": {}};', [("get_weather", W), ("get_time", "{}")]),
    Case("arguments_key", "llama3_json", f'{{"name": "search", "arguments": {NESTED}}}',
         [("search", NESTED)]),
    Case("type_first", "llama3_json",
         f'{{"type": "function", "name": "search", "parameters": {ESCAPED}}}',
         [("search", ESCAPED)]),
    Case("unicode", "llama3_json", f'{{"name":"get_weather","parameters":{UNICODE}}}',
         [("get_weather", UNICODE)]),
    Case("text_after", "llama3_json",
         '{"name": "get_time", "parameters": {}} Hope that helps.',
         [("get_time", "{}")], " Hope that helps."),
    Case("good_then_unknown", "llama3_json",
         '{"name": "get_time", "parameters": {}}; {"name": "rm_rf", "parameters": {}}',
         [("get_time", "{}")], '; {"name": "rm_rf", "parameters": {}}'),
    text_only("plain", "llama3_json", "The weather in Paris is mild."),
    text_only("leading_space_text", "llama3_json", "  Sure {not a call}"),
    text_only("json_answer", "llama3_json", '{"answer": 42, "unit": "C"}'),
    text_only("tag_then_code", "llama3_json", '<|python_tag|>brave_search.call(query="x")'),
    text_only("half_tag", "llama3_json", "<|python"),
    text_only("unknown_name", "llama3_json", '{"name": "rm_rf", "parameters": {"path": "/"}}'),
    Case("both_keys", "llama3_json", '{"name": "get_time", "parameters": {}, "arguments": {}}',
         [], '{"name": "get_time", "parameters": {}, "arguments": {}}',
         stream=([("get_time", "{}")], ', "arguments": {}}')),
    text_only("parameters_string", "llama3_json",
              '{"name": "get_weather", "parameters": "Paris"}'),
    text_only("broken_json", "llama3_json", '{"name": "get_weather" "parameters": {}}'),
    text_only("cut_in_name", "llama3_json", '<|python_tag|>{"name": "get_w'),
    Case("cut_after_arguments", "llama3_json",
         f'{{"name": "get_weather", "parameters": {W}',
         [], f'{{"name": "get_weather", "parameters": {W}',
         stream=([("get_weather", W)], None)),
]

MISTRAL = [
    Case("array_single", "mistral",
         f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}]', [("get_weather", W)]),
    Case("array_two_with_content", "mistral",
         f'Sure. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {W}}},\n '
         '{"name": "get_time", "arguments": {}}]',
         [("get_weather", W), ("get_time", "{}")], "Sure. "),
    Case("v11_single", "mistral", f"[TOOL_CALLS]get_weather[ARGS]{W}", [("get_weather", W)]),
    Case("v11_two", "mistral",
         f"[TOOL_CALLS]search[ARGS]{NESTED}[TOOL_CALLS]get_time[ARGS]{{}}",
         [("search", NESTED), ("get_time", "{}")]),
    Case("v11_no_args_token", "mistral", f"[TOOL_CALLS]search{ESCAPED}\n",
         [("search", ESCAPED)]),
    Case("single_object", "mistral",
         f'[TOOL_CALLS]{{"name": "get_weather", "arguments": {UNICODE}}}',
         [("get_weather", UNICODE)]),
    Case("marker_in_string", "mistral",
         '[TOOL_CALLS]search[ARGS]{"q": "[TOOL_CALLS]x[ARGS]{"}',
         [("search", '{"q": "[TOOL_CALLS]x[ARGS]{"}')]),
    Case("text_after", "mistral", "[TOOL_CALLS]get_time[ARGS]{} Anything else?",
         [("get_time", "{}")], " Anything else?"),
    Case("second_item_unknown", "mistral",
         '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "rm_rf", '
         '"arguments": {}}]',
         [("get_time", "{}")], ', {"name": "rm_rf", "arguments": {}}]'),
    text_only("plain", "mistral", "No tools needed [TOOL_CALL"),
    text_only("unknown_v11", "mistral", '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'),
    text_only("unknown_array", "mistral", '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
    text_only("empty_array", "mistral", "[TOOL_CALLS][]"),
    text_only("not_json", "mistral", "[TOOL_CALLS] call get_weather please"),
    text_only("name_with_space", "mistral", '[TOOL_CALLS]get weather[ARGS]{}'),
    text_only("args_string", "mistral", '[TOOL_CALLS]get_weather[ARGS]"Paris"'),
    text_only("bare_name_in_array", "mistral", '[TOOL_CALLS][{"name": get_weather}]'),
    text_only("marker_at_end", "mistral", "Calling [TOOL_CALLS]"),
    text_only("cut_in_name", "mistral", "[TOOL_CALLS]get_wea"),
    Case("invalid_in_arguments", "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}',
         [], '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}',
         stream=([("get_weather", '{"city": Paris}')], None)),
    Case("array_not_closed", "mistral",
         '[TOOL_CALLS][{"name": "get_time", "arguments": {}}',
         [("get_time", "{}")], None),
]

CASES = HERMES + LLAMA + MISTRAL
