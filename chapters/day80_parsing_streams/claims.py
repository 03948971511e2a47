"""Day 80's claims: the package's tool-call and reasoning parsers read a stream cut anywhere
as they read the whole response, turn every malformed call into content, and agree with the
snapshot; and what vLLM's early sending of a call would change.

For every case of the corpus (``corpus.py``, written by hand in each format) the whole response
is read once, then streamed in every cut ``streams.cuts`` makes: each two-piece split and the
split into single characters. A stream's content pieces joined must equal the whole reading's
content and each call's name and argument pieces joined must equal its call; a mismatch
anywhere counts. Exceptions are caught and counted. Every tool parser runs twice: in the
server's default mode, which sends a call once its whole object has been judged, and with
``early=True``, vLLM's, which sends it once its name is known and streams the arguments. The
snapshot's Hermes reader, which has the same switch, is held to the package in both modes; its
think splitter is held to the reasoning parsers; a reader that holds nothing back is run
through the same test to show it can fail.
"""

from __future__ import annotations

import functools
import json
import re

from chapters.runner import exact

from . import corpus as cp
from . import streams as st
from .snapshot import hermes as snap_hermes

FORMATS = tuple(cp.FORMATS)
MODES = (False, True)  # early: the server's default, then vLLM's
REASONING = ("qwen3", "deepseek_r1")
IMPLICIT = {"qwen3": False, "deepseek_r1": True}


def expected(case: cp.Case, reading: st.Reading) -> bool:
    """Whether the whole reading is what the case's class says: text and malformed cases give
    no call and the whole text back as content; call cases give calls."""
    if case.kind == "call":
        return bool(reading.calls)
    return not reading.calls and reading.content == case.text


@functools.cache
def tool_run(fmt: str, early: bool = False) -> dict:
    """Every case of ``fmt`` through the package, whole and in every cut."""
    parser = st.PackageTools(fmt, cp.TOOLS, early)
    out = {"streams": 0, "violations": 0, "exceptions": 0, "ids": [], "held": 0,
           "as_expected": 0, "content": {k: 0 for k in cp.MALFORMED},
           "differ": {"valid": 0, "malformed": 0}, "tried": {"valid": 0, "malformed": 0},
           "unknown_called": 0, "unknown_streams": 0, "broken_calls": 0, "broken_parse": 0}
    for case in cp.FORMATS[fmt]:
        side = "malformed" if case.kind in cp.MALFORMED else "valid"
        try:
            whole, ids = parser.whole(case.text)
        except Exception:  # noqa: BLE001 - a parser that throws has failed; count it
            out["exceptions"] += 1
            continue
        out["ids"] += ids
        good = expected(case, whole)
        out["as_expected"] += good
        if side == "malformed":
            out["content"][case.kind] += good
        for pieces in st.cuts(case.text):
            out["streams"] += 1
            try:
                s = parser.stream(pieces)
            except Exception:  # noqa: BLE001
                out["exceptions"] += 1
                continue
            out["tried"][side] += 1
            out["differ"][side] += s.reading != whole
            out["violations"] += s.violations
            out["ids"] += s.ids
            if side == "malformed":
                for _, arguments in s.reading.calls:
                    out["broken_calls"] += 1
                    out["broken_parse"] += parses(arguments)
            if case.kind == "unknown name":
                out["unknown_streams"] += 1
                out["unknown_called"] += bool(s.reading.calls)
            if case.kind == "text":
                out["held"] = max(out["held"], s.held)
    return out


def parses(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


def cases(fmt: str) -> str:
    kinds = [c.kind for c in cp.FORMATS[fmt]]
    valid = sum(k in ("text", "call") for k in kinds)
    return f"{valid} and {len(kinds) - valid}"


def differ(fmt: str, side: str, early: bool = False) -> str:
    r = tool_run(fmt, early)
    return f"{r['differ'][side]:,} of {r['tried'][side]:,}"


def both(measure) -> str:
    """A measure of one mode, judged and then early: ``"0 of 343 and 153 of 343"``."""
    return " and ".join(measure(e) for e in MODES)


def total(key: str, early: bool) -> int:
    return sum(tool_run(f, early)[key] for f in FORMATS)


def malformed(kind: str) -> str:
    n = sum(c.kind == kind for f in FORMATS for c in cp.FORMATS[f])
    return f"{sum(tool_run(f)['content'][kind] for f in FORMATS)} of {n}"


def ids_of(fmts: tuple[str, ...], pattern: str) -> str:
    ids = [i for f in fmts for e in MODES for i in tool_run(f, e)["ids"]]
    return f"{sum(bool(re.fullmatch(pattern, i)) for i in ids):,} of {len(ids):,}"


def unknown_called(early: bool) -> str:
    return of((total("unknown_called", early), total("unknown_streams", early)))


def held(fmt: str) -> int:
    return max(tool_run(fmt, e)["held"] for e in MODES)


@functools.cache
def arg_waits(fmt: str, early: bool) -> tuple[int, ...]:
    """Call cases fed one character at a time: for each argument character, how many characters
    arrived after it before it went out."""
    reader = st.PackageTools(fmt, cp.TOOLS, early)
    return tuple(w for c in cp.FORMATS[fmt] if c.kind == "call"
                 for w in st.argument_waits(reader, c.text))


def mean_wait(fmt: str, early: bool) -> str:
    waits = arg_waits(fmt, early)
    return f"{sum(waits) / len(waits):.1f}"


# ---------------------------------------------------------------- the snapshot


@functools.cache
def hermes_agreement(early: bool = False) -> tuple[int, int]:
    """The package's hermes parser against the snapshot, both in one mode: whole readings and
    every stream."""
    pkg = st.PackageTools("hermes", cp.TOOLS, early)
    snap = st.SnapshotHermes(cp.NAMES, early=early)
    same = total = 0
    for case in cp.HERMES:
        total += 1
        same += pkg.whole(case.text)[0] == snap.whole(case.text)[0]
        for pieces in st.cuts(case.text):
            total += 1
            same += pkg.stream(pieces).reading == snap.stream(pieces).reading
    return same, total


class HoldsNothing(snap_hermes.HermesStream):
    """The snapshot's reader, but text goes out at once unless a whole ``<tool_call>`` is
    there: it sees the marker only when one delta completes it."""

    def _drain(self, final: bool) -> snap_hermes.Delta:
        out = super()._drain(final)
        if self.state == "text":
            self._text(self.buf)
            self.buf = ""
        return out


@functools.cache
def snapshot_run(stream_cls=None, early: bool = False) -> tuple[int, int]:
    """(streams that differ from the whole reading, streams) for a snapshot-shaped reader over
    the whole Hermes corpus."""
    snap = st.SnapshotHermes(cp.NAMES, stream_cls, early)
    differ_ = total = 0
    for case in cp.HERMES:
        whole = snap.whole(case.text)[0]
        for pieces in st.cuts(case.text):
            total += 1
            differ_ += snap.stream(pieces).reading != whole
    return differ_, total


# ---------------------------------------------------------------- reasoning


@functools.cache
def reasoning_run(name: str) -> dict:
    parser, snap = st.PackageReasoning(name), st.SnapshotThink(IMPLICIT[name])
    out = {"streams": 0, "differ": 0, "exceptions": 0, "held": 0, "snapshot": 0, "total": 0,
           "splits": {}}
    for case in cp.REASONING:
        try:
            whole = parser.whole(case.text)
        except Exception:  # noqa: BLE001
            out["exceptions"] += 1
            continue
        out["splits"][case.label] = whole
        out["total"] += 1
        out["snapshot"] += whole == snap.whole(case.text)
        for pieces in st.cuts(case.text):
            out["streams"] += 1
            out["total"] += 1
            try:
                r, c, trace = parser.stream(pieces)
            except Exception:  # noqa: BLE001
                out["exceptions"] += 1
                continue
            out["differ"] += (r, c) != whole
            out["snapshot"] += (r, c) == snap.stream(pieces)[:2]
            out["held"] = max(out["held"], st.think_lag(case.text, *whole, trace))
    return out


def read_differently() -> str:
    a, b = (reasoning_run(n)["splits"] for n in REASONING)
    return f"{sum(a[k] != b[k] for k in a)} of {len(a)}"


def of(pair: tuple[int, int]) -> str:
    return f"{pair[0]:,} of {pair[1]:,}"


CLAIMS = [
    *(exact(f"{f}: cases written, valid and malformed", functools.partial(cases, f))
      for f in FORMATS),
    *(exact(f"{f}: streams tried, every split point and one character at a time",
            lambda f=f: f"{tool_run(f)['streams']:,}") for f in FORMATS),
    *(exact(f"{f}: whole readings as the case's class says",
            lambda f=f: f"{tool_run(f)['as_expected']} of {len(cp.FORMATS[f])}") for f in FORMATS),
    *(exact(f"{f}: streams of the valid cases that differ from the whole reading, judged and "
            "early", lambda f=f: both(functools.partial(differ, f, "valid"))) for f in FORMATS),
    *(exact(f"{f}: streams of the malformed cases that differ from the whole reading, judged "
            "and early", lambda f=f: both(functools.partial(differ, f, "malformed")))
      for f in FORMATS),
    *(exact(f"{k}: whole readings that give the whole text back as content, three formats",
            functools.partial(malformed, k)) for k in cp.MALFORMED),
    exact("unknown name: streams that sent a call, judged and early",
          lambda: both(unknown_called)),
    exact("malformed cases' streams: calls sent, judged and early",
          lambda: both(lambda e: f"{total('broken_calls', e):,}")),
    exact("malformed cases' streams, early: calls sent whose arguments json.loads reads",
          lambda: of((total("broken_parse", True), total("broken_calls", True)))),
    exact("exceptions raised by the three tool parsers, whole and streamed, both modes",
          lambda: sum(total("exceptions", e) for e in MODES)),
    exact("deltas out of OpenAI's shape, all streams of the three formats, both modes",
          lambda: sum(total("violations", e) for e in MODES)),
    exact("hermes and llama3_json call ids that are call_ and 24 letters and digits",
          lambda: ids_of(("hermes", "llama3_json"), r"call_[A-Za-z0-9]{24}")),
    exact("mistral call ids that are 9 letters and digits",
          lambda: ids_of(("mistral",), r"[A-Za-z0-9]{9}")),
    exact("hermes: most characters held back from text, the marker <tool_call> being 11",
          lambda: held("hermes")),
    exact("mistral: most characters held back from text, the marker [TOOL_CALLS] being 12",
          lambda: held("mistral")),
    *(exact(f"{f} call cases fed one character at a time: characters an argument character "
            "waits on average, judged and early",
            lambda f=f: both(functools.partial(mean_wait, f))) for f in FORMATS),
    exact("call cases of the three formats, judged: the most characters an argument character "
          "waits", lambda: max(max(arg_waits(f, False)) for f in FORMATS)),
    exact("the package's hermes parser equal to the snapshot, whole readings and streams, "
          "judged and early", lambda: both(lambda e: of(hermes_agreement(e)))),
    exact("the snapshot judging calls whole, holding nothing back: streams that differ from "
          "the whole reading",
          lambda: of(snapshot_run(HoldsNothing, early=False))),
    *(exact(f"{n}: streams whose reasoning and content differ from the whole split",
            lambda n=n: of((reasoning_run(n)["differ"], reasoning_run(n)["streams"])))
      for n in REASONING),
    *(exact(f"{n}: equal to the snapshot's think splitter, whole splits and streams",
            lambda n=n: of((reasoning_run(n)["snapshot"], reasoning_run(n)["total"])))
      for n in REASONING),
    *(exact(f"{n}: most characters held back, the marker </think> being 8",
            lambda n=n: reasoning_run(n)["held"]) for n in REASONING),
    exact("reasoning cases that qwen3 and deepseek_r1 split differently", read_differently),
]
