"""Forced tool calls (Day 79): the spec's exact shape, its grammar, its parsers, and generation.

The references are not ours: llguidance's matcher judges whether a text is in the grammar's
language (token by token on the shipped tokenizer), ``jsonschema`` judges every argument object
the shipped model writes under the spec, and ``json.loads`` judges what the parsers call JSON.
The streaming checks cut each text at every point and char by char, and require the argument
fragments joined to equal the whole response's arguments.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from nanoserve.config import DEFAULT_MODEL
from nanoserve.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from nanoserve.entrypoints.openai.reasoning.qwen3 import Qwen3ReasoningParser
from nanoserve.entrypoints.openai.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from nanoserve.structured.params import StructuredOutputsParams as Spec
from nanoserve.structured.tools import forced_call_spec
from nanoserve.testing import random_json_schema

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 7}},
           "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "Weather", "parameters": WEATHER},
         {"name": "ping", "description": "No arguments", "parameters": None}]
QWEN3 = ("<think>", "</think>", False)
R1 = ("<think>", "</think>", True)


def closed(schema):
    return Spec(json=schema, strict=True).schema()


def test_required_spec_is_an_array_of_each_tools_call_shape():
    spec = forced_call_spec(TOOLS, "required", parallel=False)
    assert (spec.kind, spec.strict) == ("json", True)
    assert spec.json == {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "get_weather"},
                                          "parameters": WEATHER},
         "required": ["name", "parameters"]},
        {"type": "object", "properties": {"name": {"const": "ping"},
                                          "parameters": {"type": "object", "properties": {}}},
         "required": ["name", "parameters"]}]}}
    assert "maxItems" not in forced_call_spec(TOOLS, "required", parallel=True).json
    item = spec.schema()["items"]["anyOf"][0]  # strict: every object with properties closed
    assert item["additionalProperties"] is False
    assert item["properties"]["parameters"]["additionalProperties"] is False


def test_named_spec_is_the_functions_parameters():
    assert forced_call_spec(TOOLS, "get_weather", parallel=True).json == WEATHER
    assert forced_call_spec(TOOLS, {"type": "function", "function": {"name": "ping"}},
                            parallel=False).json == {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="nope"):
        forced_call_spec(TOOLS, "nope", parallel=True)


def test_think_specs_are_lark_grammars_with_the_closed_schema_inside():
    spec = forced_call_spec(TOOLS, "get_weather", parallel=True, think=QWEN3)
    inner = {**closed(WEATHER), "x-guidance": {"whitespace_flexible": False}}
    assert spec.kind == "grammar"
    assert spec.grammar == ('start: think? call\n'
                            'think: "<think>" text\n'
                            'text[stop="</think>"]: /(.|\\n)*/\n'
                            f'call: /[ \\n]{{0,4}}/ %json {json.dumps(inner)}\n')
    r1 = forced_call_spec(TOOLS, "get_weather", parallel=True, think=R1).grammar
    assert r1.splitlines()[:2] == ["start: think call", 'think: "<think>"? text']
    keys = {forced_call_spec(TOOLS, c, p, t).key for c in ("required", "get_weather", "ping")
            for p in (False, True) for t in (None, QWEN3, R1)}
    assert len(keys) == 3 * 2 * 3 - 2 * 3  # parallel changes only "required"'s spec


@pytest.fixture(scope="module")
def tok():
    from nanoserve.tokenizer import Tokenizer

    return Tokenizer.from_dir(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def backend(tok):
    from nanoserve.structured.backend import GrammarBackend

    return GrammarBackend.for_tokenizer(tok, 2048, [1])  # nanoserve-tiny: vocab 2048, EOS 1


def accepts(backend, tok, spec, text) -> bool:
    m = backend.matcher(spec)
    return all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) \
        and m.is_accepting()


ARRAY = '[{"name":"get_weather","parameters":{"city":"Oslo","days":3}}]'
TWO = '[{"name":"ping","parameters":{}},{"name":"get_weather","parameters":{"city":"Rome"}}]'
ARGS = '{"city":"Oslo","days":3}'
# (choice, parallel, think) -> texts in the language, texts not in it
LANGUAGE = {
    ("required", False, None): ([ARRAY], [TWO, "[]", ARGS, ARRAY.replace("3}", "3,\"x\":1}")]),
    ("required", True, None): ([ARRAY, TWO], ["[]", '[{"name":"nope","parameters":{}}]']),
    ("get_weather", True, None): ([ARGS, '{"city":""}'],
                                  ['{"days":3}', '{"city":"Oslo", "days":3}', ARRAY,
                                   '{"city":"Oslo","days":9}', "<think>x</think>" + ARGS]),
    ("ping", True, None): (["{}"], ['{"a":1}']),
    ("get_weather", True, QWEN3): ([ARGS, "<think>hm</think>\n\n" + ARGS, "<think></think>" +
                                    ARGS], ["hm</think>" + ARGS, "<think>hm" + ARGS,
                                            "<think>x</think>\n\n\n\n\n" + ARGS]),
    ("required", False, QWEN3): (["<think>a\nb</think>\n" + ARRAY], ["<think>a</think>" + TWO]),
    ("get_weather", True, R1): (["hm</think>\n\n" + ARGS, "<think>hm</think>" + ARGS,
                                 "</think>" + ARGS], [ARGS, "hm" + ARGS]),
    ("required", True, R1): (["x</think>" + TWO], ["x</think>[]"]),
}


@pytest.mark.parametrize("case", list(LANGUAGE), ids=lambda c: f"{c[0]}-{c[1]}-{bool(c[2])}")
def test_each_spec_compiles_and_its_matcher_takes_exactly_its_language(backend, tok, case):
    spec = forced_call_spec(TOOLS, *case)
    backend.compile(spec)  # an InvalidRequest here would say the grammar is bad
    good, bad = LANGUAGE[case]
    for text in good:
        assert accepts(backend, tok, spec, text), text
    for text in bad:
        assert not accepts(backend, tok, spec, text), text


def every_cut(text):
    yield [text]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)


def stream(parser, pieces):
    """-> (content or None, [(id, name, arguments)]) from ``feed``/``finish``."""
    content, calls = "", {}
    for d in [parser.feed(p) for p in pieces] + [parser.finish()]:
        content += d.content
        for c in d.calls:
            if c.index not in calls:
                assert (c.id, c.name, c.arguments) != (None, None, None) and c.arguments == ""
                assert c.index == len(calls)
                calls[c.index] = [c.id, c.name, ""]
            else:
                assert c.id is None and c.name is None and c.arguments
                calls[c.index][2] += c.arguments
    return content or None, [tuple(v) for v in calls.values()]


NAMED = {  # text -> arguments, or None: the text is content
    ARGS: ARGS,
    '\n\n {"city": "a\\"}b", "days": 1} \n': '{"city": "a\\"}b", "days": 1}',
    "{}": "{}",
    '{"city":"Os': None,  # cut by max_tokens
    '{"city":"Oslo"} trailing': None,
    "[1]": None,
    "plain words": None,
    "": None,
    "\n\n": None,
}


@pytest.mark.parametrize("text", list(NAMED))
def test_named_parser_extracts_and_streams_to_the_same_call(text):
    got = NamedCallParser(TOOLS, "get_weather").extract(text)
    if NAMED[text] is None:
        assert not got.called and got.content == (text or None)
    else:
        assert got.content is None and [(c.name, c.arguments) for c in got.calls] == \
            [("get_weather", NAMED[text])]
        assert got.calls[0].id.startswith("call_")
    for pieces in every_cut(text):
        content, calls = stream(NamedCallParser(TOOLS, "get_weather"), pieces)
        if NAMED[text] is not None:
            assert content is None and [c[1:] for c in calls] == [("get_weather", NAMED[text])]
        elif text.strip() and text.strip()[0] == "{":  # began a call, then broke: documented
            assert content is None and calls[0][2] == text[:text.index("}") + 1 if "}" in text
                                                           else len(text)]
        else:
            assert (content, calls) == (text or None, [])


REQUIRED = {  # text -> [(name, arguments)], or None: the text is content
    ARRAY: [("get_weather", '{"city":"Oslo","days":3}')],
    TWO: [("ping", "{}"), ("get_weather", '{"city":"Rome"}')],
    '\n [ {"parameters": {"city": "]}"}, "name": "get_weather"} ]\n':
        [("get_weather", '{"city": "]}"}')],
    '[{"name":"get_weather","parameters":{"city":"Os': None,
    '[{"name":"nope","parameters":{}}]': None,
    '[{"name":"ping","parameters":[]}]': None,
    "[]": None,
    "{}": None,
    "": None,
    " \n": None,
}


@pytest.mark.parametrize("text", list(REQUIRED))
def test_required_parser_extracts_and_streams_to_the_same_calls(text):
    got = RequiredCallsParser(TOOLS).extract(text)
    want = REQUIRED[text]
    if want is None:
        assert not got.called and got.content == (text or None)
    else:
        assert got.content is None and [(c.name, c.arguments) for c in got.calls] == want
        assert len({c.id for c in got.calls}) == len(want)
    for pieces in every_cut(text):
        content, calls = stream(RequiredCallsParser(TOOLS), pieces)
        if want is not None:
            assert content is None and [c[1:] for c in calls] == want, pieces
        elif not calls:  # never began a call: the stream's content is the text
            assert content == (text or None), pieces
        else:  # began a call, then broke off (max_tokens) or went wrong: documented
            assert content is None and text.startswith("[") and len(calls) == 1


def tool_set():
    """Ten tools: four written by hand, six with seeded random properties."""
    rng = random.Random(79)
    tools = [TOOLS[0], {"name": "ping", "parameters": None},
             {"name": "search", "parameters": {"type": "object", "properties": {
                 "query": {"type": "string", "minLength": 1, "maxLength": 12},
                 "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
                 "required": ["query", "limit"]}},
             {"name": "tag", "parameters": {"type": "object", "properties": {
                 "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                          "minItems": 1, "maxItems": 3},
                 "urgent": {"type": "boolean"}}, "required": ["tags"]}}]
    for i in range(6):
        props = {f"p{k}": random_json_schema(rng, 1) for k in range(rng.randint(1, 3))}
        tools.append({"name": f"fn_{i}", "parameters": {"type": "object", "properties": props,
                                                        "required": sorted(props)}})
    return tools


def test_the_shipped_model_writes_valid_calls_under_every_forced_spec():
    from nanoserve import LLM, SamplingParams

    tools = tool_set()
    schemas = {t["name"]: t["parameters"] or {"type": "object", "properties": {}} for t in tools}
    jobs = [(t["name"], None) for t in tools]  # named, no thinking
    jobs += [("required", None)] * 3 + [(t["name"], QWEN3) for t in tools[:4]]
    jobs += [("required", QWEN3)]
    specs = [forced_call_spec(tools[:3] if c == "required" and i % 2 else tools, c,
                              parallel=False, think=th) for i, (c, th) in enumerate(jobs)]
    llm = LLM(dtype="float32", max_num_seqs=len(jobs))
    outs = llm.generate([f"Call number {i}:" for i in range(len(jobs))],
                        [SamplingParams(max_tokens=192, temperature=0, structured_outputs=s)
                         for s in specs])
    for (choice, think), out in zip(jobs, outs, strict=True):
        assert out.finish_reason == "stop", (choice, out.text)
        text = out.text
        if think:
            reasoning, text = Qwen3ReasoningParser().split(text)
        parser = RequiredCallsParser(tools) if choice == "required" \
            else NamedCallParser(tools, choice)
        got = parser.extract(text or "")
        assert got.called and got.content is None, (choice, out.text)
        for call in got.calls:
            jsonschema.validate(json.loads(call.arguments), closed(schemas[call.name]))
        assert stream(parser, list(text))[1][0][1:] == \
            (got.calls[0].name, got.calls[0].arguments)
    pool = llm.core.scheduler.kv_cache_manager
    assert pool.num_free == pool.num_blocks


def test_a_thinking_answer_splits_before_the_forced_parser_reads_it():
    text = "weighing it</think>\n\n" + ARGS
    reasoning, content = DeepSeekR1ReasoningParser().split(text)
    assert reasoning == "weighing it"
    call = NamedCallParser(TOOLS, "get_weather").extract(content).calls[0]
    assert call.arguments == ARGS
