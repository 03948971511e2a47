"""Day 80's harness: run a parser over a response whole and in every cut, and compare.

A cut is a way the tokenizer might have sliced the response into deltas. ``cuts`` gives every
split into two pieces (one per position) and the split into single characters, which puts a
boundary everywhere at once. A stream is read back into the shape a client assembles: content
joined, and per call index its name (from the first delta) and argument fragments joined; the
delta shape OpenAI promises is checked on the way (a call's first delta has the id, the name
and empty arguments; every later one only the index and arguments). Exceptions are counted,
never raised: a parser that throws on model output has failed the chapter's rule.

Adapters give the package's parsers and the snapshot one face: ``whole(text) -> Reading`` and
``stream(pieces) -> (Reading, shape violations, ids, most held back)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """What a client ends up with: the content (``""`` for none) and the calls, in order, as
    (name, arguments)."""

    content: str
    calls: tuple[tuple[str, str], ...] = ()


@dataclass
class Streamed:
    reading: Reading
    violations: int  # deltas that break OpenAI's shape
    ids: list[str]
    held: int  # the most characters fed and not yet out as content, while no call was seen


def cuts(text: str) -> Iterator[list[str]]:
    """Every two-piece split of ``text``, then ``text`` one character at a time."""
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


def count_cuts(texts) -> int:
    return sum(len(t) - 1 + 1 for t in texts)


def assemble(steps: list[tuple[int, str, list]]) -> Streamed:
    """``steps``: per feed, (characters fed so far, content released, call pieces as
    (index, id, name, arguments)) -> the client's view of the stream."""
    content, names, args, ids = [], [], [], []
    violations, held, out = 0, 0, 0
    for fed, text, pieces in steps:
        content.append(text)
        out += len(text)
        for index, id_, name, arguments in pieces:
            if name is not None:  # a call's first delta
                violations += index != len(names) or arguments != "" or id_ is None
                names.append(name)
                args.append("")
                ids.append(id_)
            else:
                violations += not 0 <= index < len(names) or id_ is not None
                if 0 <= index < len(args):
                    args[index] += arguments
        if not names:
            held = max(held, fed - out)
    return Streamed(Reading("".join(content), tuple(zip(names, args, strict=True))),
                    violations, [i for i in ids if i is not None], held)


def run_stream(feed: Callable[[str], tuple[str, list]], finish: Callable[[], tuple[str, list]],
               pieces: list[str]) -> Streamed:
    steps, fed = [], 0
    for p in pieces:
        fed += len(p)
        steps.append((fed, *feed(p)))
    steps.append((fed, *finish()))
    return assemble(steps)


def argument_waits(reader, text: str) -> list[int]:
    """Fed one character at a time: for every character of every call's arguments, how many
    characters arrived after it before it went out (0: out with its own delta)."""
    steps: list[list[int]] = []  # per call, the delta number each argument character left in
    feed, finish = reader.feeders()
    for step, ch in enumerate([*text, None]):
        _, pieces = feed(ch) if ch is not None else finish()
        for index, _, name, arguments in pieces:
            if name is not None:
                steps.append([])
            steps[index] += [step] * len(arguments)
    whole, _ = reader.whole(text)
    waits, at = [], 0
    for (_, arguments), left in zip(whole.calls, steps, strict=True):
        at = text.index(arguments, at)
        waits += [s - (at + j) for j, s in enumerate(left)]
        at += len(arguments)
    return waits


# ---------------------------------------------------------------- adapters


class PackageTools:
    """A ``nanoserve`` tool parser, by its ``--tool-call-parser`` name, in the server's default
    mode (a call sent once judged whole) or with ``early=True`` (vLLM's: sent once named)."""

    def __init__(self, name: str, tools: list[dict], early: bool = False):
        from nanoserve.entrypoints.openai.tool_parsers import tool_parser_class

        self.cls, self.tools, self.early = tool_parser_class(name), tools, early

    def whole(self, text: str) -> tuple[Reading, list[str]]:
        e = self.cls(self.tools, early=self.early).extract(text)
        return (Reading(e.content or "", tuple((c.name, c.arguments) for c in e.calls)),
                [c.id for c in e.calls])

    def feeders(self):
        p = self.cls(self.tools, early=self.early)

        def unpack(d):
            return d.content, [(c.index, c.id, c.name, c.arguments) for c in d.calls]

        return (lambda x: unpack(p.feed(x))), (lambda: unpack(p.finish()))

    def stream(self, pieces: list[str]) -> Streamed:
        return run_stream(*self.feeders(), pieces)


class SnapshotHermes:
    """The snapshot's Hermes reader (it makes no ids: a first delta is marked by its name)."""

    def __init__(self, names: set[str], stream_cls=None, early: bool = False):
        from .snapshot import hermes

        self.h, self.names, self.early = hermes, names, early
        self.stream_cls = stream_cls or hermes.HermesStream

    def whole(self, text: str) -> tuple[Reading, list[str]]:
        calls, content = self.h.extract(text, self.names)
        return Reading(content or "", tuple((c.name, c.arguments) for c in calls)), []

    def feeders(self):
        s = self.stream_cls(self.names, early=self.early)

        def unpack(d):
            return d.content, [(c.index, "-" if c.name else None, c.name, c.arguments)
                               for c in d.calls]

        return (lambda x: unpack(s.feed(x))), (lambda: unpack(s.finish()))

    def stream(self, pieces: list[str]) -> Streamed:
        return run_stream(*self.feeders(), pieces)


class PackageReasoning:
    def __init__(self, name: str):
        from nanoserve.entrypoints.openai.reasoning import reasoning_parser_class

        self.cls = reasoning_parser_class(name)

    def whole(self, text: str) -> tuple[str, str]:
        r, c = self.cls().split(text)
        return r or "", c or ""

    def stream(self, pieces: list[str]):
        p = self.cls()
        return _think_stream(lambda x: (lambda d: (d.reasoning, d.content))(p.feed(x)),
                             lambda: (lambda d: (d.reasoning, d.content))(p.finish()), pieces)


class SnapshotThink:
    def __init__(self, implicit_start: bool):
        from .snapshot import think

        self.t, self.implicit = think, implicit_start

    def whole(self, text: str) -> tuple[str, str]:
        r, c = self.t.split(text, self.implicit)
        return r or "", c or ""

    def stream(self, pieces: list[str]):
        s = self.t.ThinkStream(self.implicit)
        return _think_stream(s.feed, s.finish, pieces)


def _think_stream(feed, finish, pieces) -> tuple[str, str, list[tuple[int, int, int]]]:
    """-> (reasoning joined, content joined, per feed (characters fed, reasoning out, content
    out))."""
    r, c, fed, trace = "", "", 0, []
    for p in pieces:
        fed += len(p)
        a, b = feed(p)
        r, c = r + a, c + b
        trace.append((fed, len(r), len(c)))
    a, b = finish()
    return r + a, c + b, trace


def think_lag(text: str, reasoning: str, content: str, trace) -> int:
    """The most characters a reasoning stream kept back: after each feed, how far the text fed
    runs ahead of the place in ``text`` that the pieces out so far reach (the reasoning starts
    where the whole split's reasoning starts, the content is the text's tail)."""
    r_at = text.find(reasoning) if reasoning else 0
    c_at = len(text) - len(content)
    def reached(fed: int, r: int, c: int) -> int:
        if c or (r == len(reasoning) and fed >= c_at):  # a closing marker read counts
            return c_at + c
        return r_at + r if r or fed >= r_at else 0  # and so does an opening one

    return max((t[0] - reached(*t) for t in trace), default=0)
