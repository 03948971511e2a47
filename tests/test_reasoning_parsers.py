"""Reasoning parsers (Day 80): the split tables, and the stream agreeing with them for every cut.

The tables are written from the formats' rules (Qwen3 opens its own ``<think>`` or writes none;
DeepSeek-R1 starts inside the thinking), not from the parser's output. The stream checks cut
each text at every point into two pieces, into single characters, and at seeded random points,
and require the reasoning deltas joined and the content deltas joined to equal ``split``, and
``ended`` to say what the text has shown so far.
"""

from __future__ import annotations

import random

import pytest

from nanoserve.entrypoints.openai.reasoning import REASONING_PARSERS, reasoning_parser_class
from nanoserve.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from nanoserve.entrypoints.openai.reasoning.qwen3 import Qwen3ReasoningParser

# text -> (qwen3's split, deepseek_r1's split)
TABLE = {
    "<think>plan</think>answer": (("plan", "answer"), ("plan", "answer")),
    "<think>\nplan\n</think>\n\nanswer": (("\nplan\n", "\n\nanswer"), ("\nplan\n", "\n\nanswer")),
    "plan</think>answer": ((None, "plan</think>answer"), ("plan", "answer")),
    "answer only": ((None, "answer only"), ("answer only", None)),
    "": ((None, None), (None, None)),
    "<think></think>": ((None, None), (None, None)),
    "<think></think>answer": ((None, "answer"), (None, "answer")),
    "</think>answer": ((None, "</think>answer"), (None, "answer")),
    "<think>unclosed thought": (("unclosed thought", None), ("unclosed thought", None)),
    "<think>": ((None, None), (None, None)),
    "<think>cut at </th": (("cut at </th", None), ("cut at </th", None)),
    "<thi": ((None, "<thi"), ("<thi", None)),
    "<thinking>not a marker": ((None, "<thinking>not a marker"),
                               ("<thinking>not a marker", None)),
    "<": ((None, "<"), ("<", None)),
    " <think>late</think>x": ((None, " <think>late</think>x"), (" <think>late", "x")),
    "<think>a</think>b</think>c": (("a", "b</think>c"), ("a", "b</think>c")),
    "<think>a<think>b</think>c": (("a<think>b", "c"), ("a<think>b", "c")),
    "<think><think>x</think>": (("<think>x", None), ("<think>x", None)),
    "<think>x</think>\n\n": (("x", "\n\n"), ("x", "\n\n")),
    "<think>x<</think>y<": (("x<", "y<"), ("x<", "y<")),
    "<think>x</</think>y": (("x</", "y"), ("x</", "y")),
    "<think>é ü</think>日本": (("é ü", "日本"), ("é ü", "日本")),
}
PARSERS = [Qwen3ReasoningParser, DeepSeekR1ReasoningParser]


@pytest.mark.parametrize("text", list(TABLE))
@pytest.mark.parametrize("which", [0, 1], ids=["qwen3", "deepseek_r1"])
def test_split_table(which, text):
    assert PARSERS[which]().split(text) == TABLE[text][which]


def test_registry_names_the_two_classes_with_their_markers():
    assert reasoning_parser_class("qwen3") is Qwen3ReasoningParser
    assert reasoning_parser_class("deepseek_r1") is DeepSeekR1ReasoningParser
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek_r1"}
    for cls in PARSERS:
        assert (cls.start, cls.end) == ("<think>", "</think>")
    assert not Qwen3ReasoningParser.implicit_start and DeepSeekR1ReasoningParser.implicit_start
    with pytest.raises(ValueError, match="qwen3"):
        reasoning_parser_class("nope")


def stream(cls, pieces):
    """Feed ``pieces``; -> (reasoning or None, content or None, ended after each piece)."""
    p = cls()
    reasoning = content = ""
    ended = []
    for piece in pieces:
        d = p.feed(piece)
        reasoning, content = reasoning + d.reasoning, content + d.content
        ended.append(p.ended)
    d = p.finish()
    reasoning, content = reasoning + d.reasoning, content + d.content
    return reasoning or None, content or None, ended


def shown_ended(cls, prefix: str) -> bool:
    """What ``ended`` must say once ``prefix`` has been fed: ``</think>`` has passed, or
    (Qwen3) the prefix can no longer begin ``<think>``."""
    if cls.implicit_start or prefix.startswith(cls.start):
        body = prefix[len(cls.start):] if prefix.startswith(cls.start) else prefix
        return cls.end in body
    return not cls.start.startswith(prefix)


def cuts(text: str, rng: random.Random):
    yield [text]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)
    for _ in range(20):
        points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
        yield [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize("cls", PARSERS, ids=["qwen3", "deepseek_r1"])
def test_every_cut_of_every_table_text_streams_to_the_split(cls):
    rng = random.Random(80)
    for text in TABLE:
        want = cls().split(text)
        for pieces in cuts(text, rng):
            reasoning, content, ended = stream(cls, pieces)
            assert (reasoning, content) == want, (text, pieces)
            fed = ""
            for piece, flag in zip(pieces, ended, strict=True):
                fed += piece
                assert flag == shown_ended(cls, fed), (text, pieces, fed)


@pytest.mark.parametrize("cls", PARSERS, ids=["qwen3", "deepseek_r1"])
def test_random_texts_over_the_markers_alphabet_stream_to_the_split(cls):
    """Texts built from marker fragments, so partial and overlapping markers are common."""
    rng = random.Random(42)
    atoms = ["<think>", "</think>", "<", "</", "</th", "<thi", "ink>", ">", "a", "\n", " "]
    for _ in range(300):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 8)))
        points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 5))))
        pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
        reasoning, content, _ = stream(cls, pieces)
        assert (reasoning, content) == cls().split(text), (text, pieces)


def test_a_partial_end_marker_is_held_back_until_it_resolves():
    p = DeepSeekR1ReasoningParser()
    assert (p.feed("plan </th").reasoning, p.ended) == ("plan ", False)
    d = p.feed("ink>\n\nanswer")
    assert (d.reasoning, d.content, p.ended) == ("", "\n\nanswer", True)
    q = Qwen3ReasoningParser()
    assert not q.feed("<th") and not q.ended  # could still be <think>
    d = q.feed("anks")  # "<thanks": no think block at all
    assert (d.content, q.ended) == ("<thanks", True)
    r = Qwen3ReasoningParser()
    assert not r.feed("<think>") and not r.ended
    assert r.feed("x</").reasoning == "x"
    assert r.finish().reasoning == "</"  # the stream ended: the held tail was thinking
