"""The tool-call parsers (hermes, llama3_json, mistral) against text written to each format.

Each case of ``tool_parser_cases.py`` is read whole (``extract``) and compared with the calls
and content written down by hand; then streamed, cut at every single point, one character at a
time, and at a few seeded random multi-cuts, and each stream must give the same calls (name,
then argument fragments joined) and content (deltas joined) as ``extract``: always in the
default mode, which sends a call once it has been judged whole; with ``early=True`` (vLLM's
way, arguments streamed as they come) for every case but those whose call broke after its name
went out, which have the stream written down for them. The JSON scanner is
checked against the ``json`` module's own idea of where a value ends.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from nanoserve.entrypoints.openai.tool_parsers import TOOL_PARSERS, tool_parser_class
from nanoserve.entrypoints.openai.tool_parsers.base import StreamDelta
from nanoserve.entrypoints.openai.tool_parsers.json_scan import (
    NEED,
    SLOW,
    Scanner,
    header,
    held,
    read_call,
)
from tests.tool_parser_cases import CASES, TOOLS, Case

ID_SHAPE = {"hermes": r"call_[A-Za-z0-9]{24}", "llama3_json": r"call_[A-Za-z0-9]{24}",
            "mistral": r"[A-Za-z0-9]{9}"}


def parser(name: str, tools=TOOLS, early: bool = False):
    return tool_parser_class(name)(tools, early=early)


def cuts(text: str, seed: int = 0) -> list[list[int]]:
    """Every single cut, one character at a time, and five random multi-cuts."""
    n = len(text)
    out = [[i] for i in range(n + 1)] + [list(range(1, n))]
    rng = random.Random(seed)
    for _ in range(5):
        out.append(sorted(rng.sample(range(n + 1), min(n + 1, rng.randint(2, 6)))))
    return out


def stream(name: str, text: str, at: list[int], tools=TOOLS, early: bool = False):
    """Feed ``text`` cut at ``at``, then finish: ``(calls, content, ids)`` with the delta
    shapes checked on the way."""
    p = parser(name, tools, early)
    deltas: list[StreamDelta] = []
    prev = 0
    for c in [*at, len(text)]:
        deltas.append(p.feed(text[prev:c]))
        prev = c
    deltas.append(p.finish())
    calls: list[list[str]] = []
    ids = []
    content = ""
    for d in deltas:
        content += d.content
        for c in d.calls:
            if c.name is not None:                   # a call's first delta
                assert c.index == len(calls) and c.arguments == "" and c.id
                calls.append([c.name, ""])
                ids.append(c.id)
            else:
                assert c.index == len(calls) - 1 and c.id is None and c.arguments
                calls[-1][1] += c.arguments
    return [tuple(c) for c in calls], content or None, ids


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.parser}-{c.id}")
def test_extract_reads_the_text_as_written_down(case: Case):
    got = parser(case.parser).extract(case.text)
    assert [(c.name, c.arguments) for c in got.calls] == case.calls
    assert got.content == case.content
    assert got.called == bool(case.calls)
    for c in got.calls:
        assert isinstance(json.loads(c.arguments), dict)
        assert re.fullmatch(ID_SHAPE[case.parser], c.id)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.parser}-{c.id}")
@pytest.mark.parametrize("early", [False, True], ids=["judged", "early"])
def test_every_cut_streams_what_extract_reads(case: Case, early: bool):
    got = parser(case.parser).extract(case.text)
    want = ([(c.name, c.arguments) for c in got.calls], got.content)
    if early and case.stream:
        want = case.stream
    for at in cuts(case.text, seed=len(case.text)):
        calls, content, ids = stream(case.parser, case.text, at, early=early)
        assert (calls, content) == want, at
        assert all(re.fullmatch(ID_SHAPE[case.parser], i) for i in ids)
        assert len(set(ids)) == len(ids)


def test_a_stream_that_broke_after_its_name_raises_nothing_and_reads_no_more_calls():
    text = ('<tool_call>{"name": "get_time", "arguments": {"a": ]}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    calls, content, _ = stream("hermes", text, list(range(1, len(text))), early=True)
    assert calls == [("get_time", '{"a": ')]
    assert content.startswith("]}</tool_call>") and content.endswith("</tool_call>")
    assert parser("hermes").extract(text).calls[0].arguments == "{}"


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_without_tools_any_name_is_a_call(name):
    text = {"hermes": '<tool_call>{"name": "anything", "arguments": {"x": 1}}</tool_call>',
            "llama3_json": '{"name": "anything", "parameters": {"x": 1}}',
            "mistral": '[TOOL_CALLS]anything[ARGS]{"x": 1}'}[name]
    for tools in (None, []):
        got = parser(name, tools).extract(text)
        assert [(c.name, c.arguments) for c in got.calls] == [("anything", '{"x": 1}')]
        assert got.content is None
        assert stream(name, text, [len(text) // 2], tools)[:2] == ([("anything", '{"x": 1}')],
                                                                   None)
    assert parser(name).extract(text).calls == []    # with tools, "anything" is unknown


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_the_registry_names_each_class(name):
    cls = tool_parser_class(name)
    assert cls.name == name


def test_a_text_with_no_call_holds_back_only_a_possible_marker():
    p = parser("hermes")
    assert p.feed("Hello <tool_c").content == "Hello "
    assert p.feed("ar").content == "<tool_car"
    assert p.finish().content == ""
    p = parser("mistral")
    assert p.feed("a [TOOL_").content == "a "
    assert p.finish().content == "[TOOL_"


def test_arguments_stream_before_the_call_closes_when_early():
    p = parser("hermes", early=True)
    d = p.feed('<tool_call>{"name": "search", "arguments": {"q": "long te')
    assert [(c.index, c.name, c.arguments) for c in d.calls] == [
        (0, "search", ""), (0, None, '{"q": "long te')]
    assert [c.arguments for c in p.feed('xt"}}').calls] == ['xt"}']


JSON_VALUES = ['{}', '[]', '{"a": "}"}', '{"a": "\\"}"}', '{"a": [1, {"b": "]"}], "c": {}}',
               '["\\\\", "\\\\\\"", {"x": "\u00e9"}]', '{"k": "\\ud83c\\udf27 [{"}']


@pytest.mark.parametrize("value", JSON_VALUES)
def test_scanner_finds_the_end_json_finds(value):
    text = value + ' , "tail"}]'
    end = json.JSONDecoder().raw_decode(text)[1]
    whole = Scanner(0)
    whole.advance(text)
    assert (whole.end, whole.bad) == (end, None)
    piecewise = Scanner(0)
    for i in range(1, len(text) + 1):
        piecewise.advance(text[:i])
        assert piecewise.end == (end if i >= end else None)


def test_scanner_reports_a_closer_that_does_not_match():
    s = Scanner(0)
    s.advance('{"a": [1}')
    assert (s.end, s.bad) == (None, 8)


def test_header_needs_more_then_answers():
    text = '{"name": "get_time", "arguments": {}}'
    args = text.index("{", 1)
    for i in range(args + 1):
        assert header(text[:i], 0, ("arguments",)) == NEED, i
    for i in range(args + 1, len(text) + 1):
        assert header(text[:i], 0, ("arguments",)) == ("get_time", args)
    assert header('{"arguments": {}, "name": "x"}', 0, ("arguments",)) == SLOW
    assert header('{"name": "x", "parameters": {}}', 0, ("arguments",)) == SLOW
    assert header('{"name": "' + "x" * 600, 0, ("arguments",)) == SLOW


def test_read_call_slices_the_arguments_as_written():
    obj = '{"name": "f", "arguments": {"b": 2,  "a": [1]}}'
    name, a, b = read_call(obj, ("arguments",))
    assert (name, obj[a:b]) == ("f", '{"b": 2,  "a": [1]}')
    assert read_call('{"name": "f", "arguments": 1}', ("arguments",)) is None
    assert read_call('[1]', ("arguments",)) is None


def test_held_is_the_tail_that_could_become_the_marker():
    assert held("abc<tool_ca", "<tool_call>") == 8
    assert held("abc<", "<tool_call>") == 1
    assert held("abc", "<tool_call>") == 0
    assert held("<tool_call>", "<tool_call>") == 0


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_truncation_reads_the_same_however_cut_and_raises_nothing(name):
    """A response can stop anywhere (max_tokens): each prefix of each case must stream the same
    whichever way it is cut; a stream that sent no call agrees with ``extract``; a response
    read as no call is its own content, every character kept."""
    for case in (c for c in CASES if c.parser == name):
        for n in range(len(case.text) + 1):
            text = case.text[:n]
            one = stream(name, text, list(range(1, n)))[:2]
            assert stream(name, text, [n // 2])[:2] == one, (case.id, n)
            got = parser(name).extract(text)
            if not got.calls:
                assert got.content == (text or None), (case.id, n)
            if not one[0]:
                assert (got.calls, got.content) == ([], one[1]), (case.id, n)
