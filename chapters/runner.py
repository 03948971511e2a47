"""The claims runner: every chapter's numbers, recomputed and held against the prose.

Why this module exists: a book about performance rots the moment a number in the prose stops
being the number the code produces. So the stated values live in one place only, the numbers
table of the chapter's README.md (the table whose header starts ``| claim | stated |``), and
``claims.py`` says, for each row, how to measure it. The runner reads the table, pairs every row
with its claim by the row's label (the text of its first column, exactly), and compares what the
code measures with what the row states. Nothing in ``claims.py`` repeats a stated value.

A chapter's claims, with the four kinds that ``make test`` treats differently::

    from chapters.runner import bound, exact, gpu, timed

    CLAIMS = [
        exact("blocks paging allocates", count_blocks),             # row says: 129
        exact("share of the pool in use", share, fmt="{:.1%}".format),   # row says: 25.2%
        bound("max relative logit difference", worst_error),        # row says: ≤ 1e-5
        timed("decode speed-up, batched / one at a time", speedup), # row says: ≥ 2x
        gpu("decode tokens/s, Llama-3.2-1B shape", result_file="decode.json",
            key="tokens_per_s", fmt="{:,.0f}".format),              # row says: ≥ 9,000
    ]

- ``exact(row, measure, fmt=str)``: ``fmt(measure())`` must read exactly as the row states.
- ``bound(row, measure, fmt=None)``: the row states a comparison, parsed here: ``< 60 s``,
  ``≤ 1e-5``, ``≥ 3x``, ``> 1x``, ``at most 0.5 ms``, ``at least 25%`` (operators ``<``, ``<=``,
  ``≤``, ``>``, ``>=``, ``≥``, ``at most``, ``at least``; units none, ``x``, ``s``, ``ms``,
  ``%``). Strictness is kept: ``< 60 s`` fails at exactly 60. The measure returns base units:
  seconds for ``s`` and ``ms``, a fraction for ``%`` (0.25 for ``25%``), a ratio for ``x``.
- ``timed(row, measure, fmt=None)``: a bound whose measure reads a clock. ``make test`` never
  runs it (the project has no timed tests); ``make chapter-N``, ``make chapters``, the site
  build and ``make bench`` do. Measure a ratio of two things timed in one run, in interleaved
  rounds (``chapters.common.best_of``); an absolute bound keeps at least 2x headroom.
- ``gpu(row, result_file, key, measure=None, fmt=None)``: a number only a card can produce. On
  a CUDA machine with a ``measure`` it is measured; otherwise it is read from the committed
  ``results/<result_file>``, which must name ``device``, ``torch``, ``cuda``, ``date`` and
  ``command`` and hold the value under ``values[key]``. The verdict then reads
  ``pass from results (NVIDIA H200, 2026-11-30)``, never a bare pass; without a file it is
  ``skipped: needs a GPU``. A results file missing a field is an error.
- ``exact``, ``bound`` and ``timed`` take ``needs``: a function that says why this machine
  cannot make the measurement (a CPU whose oneDNN has no bf16 kernel), or ``None`` when it
  can. A claim that cannot be made here reads ``skipped: <why>``, not measured and not failed;
  the prose states the condition beside the claim.
- ``recorded(row, result_file, key, fmt=None)``: a long run (a soak of 10,000 requests) read
  from a committed results file naming ``machine``, ``date`` and ``command``. The chapter's own
  claims should also rerun a reduced version that fits in a minute.

A gpu or recorded row is compared as a bound when its stated text parses as one, else exactly.

Refusals, not repairs: a claim whose row is missing, a label that two rows share, a row that no
claim checks, or two claims on one row make the chapter an error before anything is measured.

Editing one stated cell must make the chapter fail. ``contradictions(claim, stated, measured)``
gives the edits ``tests/test_chapters.py`` tries for every row, re-judged on one cached
measurement: for an exact row, one digit changed (or, with no digit, words appended); for a
bound, the operator negated (``≤ b`` becomes ``> b``) and, separately, the number moved past
the measurement (an upper bound set halfway from the measurement towards zero, a lower bound
half as far again above it). Timed rows are re-judged on a synthetic measurement, never timed.

    python -m chapters.runner 7                  # one chapter, every kind (make chapter-7)
    python -m chapters.runner all                # every chapter (make chapters)
    python -m chapters.runner all --kinds timed,gpu,recorded    # what make bench adds
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Without CUDA, Triton runs only in its interpreter, and the flag must be set before anything
# imports triton: in one process running every chapter (make chapters, the site build), Day 49's
# inductor imports it long before Day 60's kernel does. The runner chooses it for its process;
# nanoserve.cuda.kernels only checks that someone did (nanoserve.cuda.triton_mode). Notebooks
# that import a chapter's claims get it from here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

CHAPTERS = Path(__file__).resolve().parent
KINDS = ("exact", "bound", "timed", "gpu", "recorded")
# What every committed results file must name, by the kind of claim that reads it.
RESULT_FIELDS = {"gpu": ("device", "torch", "cuda", "date", "command"),
                 "recorded": ("machine", "date", "command")}


class ChapterError(ValueError):
    """The README's numbers table and claims.py do not pair up, or a row cannot be read."""


# ---------------------------------------------------------------------------- bounds


_OPS = {"<": "<", "<=": "<=", "≤": "<=", "at most": "<=", ">": ">", ">=": ">=", "≥": ">=",
        "at least": ">="}
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_SYMBOL = {"<": "<", "<=": "≤", ">": ">", ">=": "≥"}
_SCALE = {"": 1.0, "x": 1.0, "s": 1.0, "ms": 1e-3, "%": 1e-2}
_BOUND = re.compile(r"(?P<op>at most|at least|<=|>=|≤|≥|<|>)\s*"
                    r"(?P<num>[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
                    r"(?P<unit>x|ms|s|%)?")


@dataclass(frozen=True, slots=True)
class Bound:
    """A comparison parsed from stated text: ``op`` in <, <=, >, >=; ``number`` as written
    (in ``unit``). ``threshold`` is the number in base units (seconds, fraction, ratio).

    >>> b = parse_bound("< 60 s"); (b.op, b.threshold, b.holds(59.9), b.holds(60.0))
    ('<', 60.0, True, False)
    >>> parse_bound("≥ 25%").holds(0.25)
    True
    """

    op: str
    number: float
    unit: str

    @property
    def threshold(self) -> float:
        return self.number * _SCALE[self.unit]

    @property
    def upper(self) -> bool:
        return self.op in ("<", "<=")

    def holds(self, measured: float) -> bool:
        m, t = float(measured), self.threshold
        return {"<": m < t, "<=": m <= t, ">": m > t, ">=": m >= t}[self.op]

    def text(self) -> str:
        gap = " " if self.unit in ("s", "ms") else ""
        return f"{_SYMBOL[self.op]} {self.number:.6g}{gap}{self.unit}"

    def show(self, measured: float) -> str:
        """The measurement in the row's own unit."""
        m = float(measured)
        if self.unit == "%":
            return f"{m:.1%}"
        if self.unit == "ms":
            return f"{m * 1e3:.2f} ms"
        if self.unit == "s":
            return f"{m:.1f} s"
        if self.unit == "x":
            return f"{m:.2f}x"
        return f"{m:.3g}"


def parse_bound(text: str) -> Bound:
    """``"≤ 1e-5"`` -> Bound('<=', 1e-05, ''). Refuses text that is not one comparison."""
    m = _BOUND.fullmatch(text.strip())
    if not m:
        raise ChapterError(f"{text!r} is not a bound: write an operator (<, ≤, >, ≥, at most, "
                           f"at least), a number and optionally a unit (x, s, ms, %)")
    return Bound(_OPS[m["op"]], float(m["num"].replace(",", "")), m["unit"] or "")


def is_bound(text: str) -> bool:
    return _BOUND.fullmatch(text.strip()) is not None


# ---------------------------------------------------------------------------- claims


@dataclass(frozen=True, slots=True)
class Claim:
    """One row of the chapter's numbers table and how to measure it (see the module docstring).

    ``row`` is the row's label, the text of its first column. ``fmt`` formats a measurement for
    the table (and, for an exact claim, for the comparison)."""

    row: str
    kind: str
    measure: Callable[[], Any] | None = None
    fmt: Callable[[Any], str] | None = None
    result_file: str | None = None
    key: str | None = None
    needs: Callable[[], str | None] | None = None  # why this machine cannot measure it, or None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.row!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind in RESULT_FIELDS and not (self.result_file and self.key):
            raise ValueError(f"{self.kind} claim {self.row!r} needs result_file and key")
        if self.kind not in RESULT_FIELDS and self.measure is None:
            raise ValueError(f"{self.kind} claim {self.row!r} needs a measure")
        if self.measure is not None and not callable(self.measure):
            raise ValueError(f"claim {self.row!r}: measure must be callable, got "
                             f"{self.measure!r}; the stated value lives in README.md's numbers "
                             f"table, not in claims.py")

    @property
    def name(self) -> str:
        return self.row

    def compares_as_bound(self, stated: str) -> bool:
        return self.kind in ("bound", "timed") or (self.kind in RESULT_FIELDS
                                                   and is_bound(stated))

    def holds(self, stated: str, measured: Any) -> bool:
        """The verdict: does ``measured`` support the text ``stated``?"""
        if self.compares_as_bound(stated):
            return parse_bound(stated).holds(measured)
        return self.show(stated, measured) == stated

    def show(self, stated: str, measured: Any) -> str:
        if self.fmt is not None:
            return self.fmt(measured)
        if self.compares_as_bound(stated):
            return parse_bound(stated).show(measured)
        return str(measured)


Needs = Callable[[], str | None] | None


def exact(row: str, measure: Callable[[], Any], fmt: Callable[[Any], str] = str,
          needs: Needs = None) -> Claim:
    """``fmt(measure())`` must read exactly as the row states."""
    return Claim(row, "exact", measure, fmt, needs=needs)


def bound(row: str, measure: Callable[[], float],
          fmt: Callable[[Any], str] | None = None, needs: Needs = None) -> Claim:
    """The row states a comparison (``≤ 1e-5``, ``≥ 3x``); the measurement must satisfy it."""
    return Claim(row, "bound", measure, fmt, needs=needs)


def timed(row: str, measure: Callable[[], float],
          fmt: Callable[[Any], str] | None = None, needs: Needs = None) -> Claim:
    """A bound whose measure reads a clock: never run by ``make test``."""
    return Claim(row, "timed", measure, fmt, needs=needs)


def gpu(row: str, result_file: str, key: str, measure: Callable[[], Any] | None = None,
        fmt: Callable[[Any], str] | None = None) -> Claim:
    """Measured on a card, or read from a committed results file that names the card."""
    return Claim(row, "gpu", measure, fmt, result_file, key)


def recorded(row: str, result_file: str, key: str,
             fmt: Callable[[Any], str] | None = None) -> Claim:
    """A long run's number, read from the committed results file its command wrote."""
    return Claim(row, "recorded", None, fmt, result_file, key)


def contradictions(claim: Claim, stated: str, measured: Any) -> list[str]:
    """Edits of ``stated`` that ``measured`` must not support (the rule in the docstring)."""
    if not claim.compares_as_bound(stated):
        digits = [i for i, c in enumerate(stated) if c.isdigit()]
        if not digits:
            return [stated + " (edited)"]
        i = digits[0]
        return [stated[:i] + str((int(stated[i]) + 1) % 10) + stated[i + 1:]]
    b = parse_bound(stated)
    m = float(measured)
    step = (abs(m) or 1.0) / 2
    moved = (m - step) if b.upper else (m + step)
    return [Bound(_NEGATED[b.op], b.number, b.unit).text(),
            Bound(b.op, moved / _SCALE[b.unit], b.unit).text()]


def satisfying(stated: str) -> float:
    """A synthetic measurement that the bound ``stated`` accepts, well inside it (for timed
    rows, which tests re-judge without timing anything)."""
    b = parse_bound(stated)
    t = b.threshold
    step = abs(t) or 1.0
    return t - step / 2 if b.upper else t + step


# ---------------------------------------------------------------------------- the table


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip().replace(r"\|", "|") for p in parts[1:-1]]


def numbers_table(readme: Path, text: str | None = None) -> dict[str, str]:
    """label -> stated text, from the README's one table headed ``| claim | stated |``
    (``text``, when given, stands in for the file's contents)."""
    tables, current = [], []
    text = readme.read_text() if text is None else text
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    numbers = [t for t in tables if _cells(t[0])[:2] == ["claim", "stated"]]
    if len(numbers) != 1:
        raise ChapterError(f"{readme}: {len(numbers)} tables are headed '| claim | stated |'; "
                           f"a chapter has exactly one numbers table")
    rows: dict[str, str] = {}
    twice = []
    for line in numbers[0][2:]:
        cells = _cells(line)
        if len(cells) < 2 or not cells[0]:
            raise ChapterError(f"{readme}: a numbers-table row needs a label and a stated "
                               f"value: {line!r}")
        if cells[0] in rows:
            twice.append(cells[0])
        rows[cells[0]] = cells[1]
    if twice:
        raise ChapterError(f"{readme}: these labels name more than one row: {twice}")
    return rows


def bind(chapter: Path, claims: list[Claim] | None = None) -> list[tuple[Claim, str]]:
    """Pair every claim with the stated text of its row; refuse any row or claim left over."""
    claims = load_claims(chapter) if claims is None else claims
    rows = numbers_table(chapter / "README.md")
    problems = []
    named = [c.row for c in claims]
    for label in sorted({r for r in named if named.count(r) > 1}):
        problems.append(f"two claims check the row {label!r}")
    for label in named:
        if label not in rows:
            problems.append(f"claim {label!r} has no row in the numbers table")
    for label in rows:
        if label not in named:
            problems.append(f"row {label!r} is checked by no claim")
    for c in claims:
        if c.row in rows and c.kind in ("bound", "timed"):
            try:
                parse_bound(rows[c.row])
            except ChapterError as e:
                problems.append(f"row {c.row!r}: {e}")
    if problems:
        raise ChapterError(f"{chapter.name}: " + "; ".join(problems))
    return [(c, rows[c.row]) for c in claims]


# ---------------------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class Result:
    claim: Claim
    stated: str
    measured: str  # as shown in the table
    verdict: str  # pass, FAIL, error: ..., skipped: ..., pass from results (...), pass (on ...)
    value: Any = field(default=None, compare=False)  # the raw measurement, for re-judging

    @property
    def failed(self) -> bool:
        return self.verdict.startswith(("FAIL", "error"))

    @property
    def blocking(self) -> bool:
        """A failure that fails CI and the site build: anything but a timed claim."""
        return self.failed and self.claim.kind != "timed"


def _gpu_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _device_name() -> str:
    import torch
    return torch.cuda.get_device_name()


def _judge(claim: Claim, stated: str, value: Any, how: str = "") -> Result:
    ok = claim.holds(stated, value)
    verdict = ("pass" if ok else "FAIL") + (f" {how}" if how else "")
    return Result(claim, stated, claim.show(stated, value), verdict, value)


def _from_results(claim: Claim, stated: str, chapter: Path) -> Result:
    path = chapter / "results" / claim.result_file
    if not path.is_file():
        what = "needs a GPU" if claim.kind == "gpu" else f"no results/{claim.result_file}"
        return Result(claim, stated, "-", f"skipped: {what}")
    data = json.loads(path.read_text())
    missing = [f for f in RESULT_FIELDS[claim.kind] if not data.get(f)]
    if missing:
        return Result(claim, stated, "-", f"error: results/{claim.result_file} does not name "
                                          f"{', '.join(missing)}")
    values = data.get("values", {})
    if claim.key not in values:
        return Result(claim, stated, "-", f"error: results/{claim.result_file} has no "
                                          f"values[{claim.key!r}]")
    where = data["device"] if claim.kind == "gpu" else data["machine"]
    return _judge(claim, stated, values[claim.key], f"from results ({where}, {data['date']})")


def evaluate(claim: Claim, stated: str, chapter: Path) -> Result:
    """Measure one claim (or read its results) and judge it against ``stated``."""
    try:
        why_not = claim.needs() if claim.needs is not None else None
        if why_not:
            return Result(claim, stated, "-", f"skipped: {why_not}")
        if claim.kind in RESULT_FIELDS:
            if claim.kind == "gpu" and claim.measure is not None and _gpu_available():
                return _judge(claim, stated, claim.measure(), f"(on {_device_name()})")
            return _from_results(claim, stated, chapter)
        return _judge(claim, stated, claim.measure())
    except Exception as e:  # a claim that cannot be computed is a failure, shown as such
        return Result(claim, stated, f"{type(e).__name__}: {e}", "error")


def chapter_dir(day: int | str) -> Path:
    matches = sorted(CHAPTERS.glob(f"day{int(day):02d}_*"))
    if len(matches) != 1:
        raise ValueError(f"no chapter for day {day} (looked for chapters/day{int(day):02d}_*)")
    return matches[0]


def all_chapters() -> list[Path]:
    return sorted(p for p in CHAPTERS.glob("day[0-9][0-9]_*") if (p / "claims.py").is_file())


def load_claims(chapter: Path) -> list[Claim]:
    module = importlib.import_module(f"chapters.{chapter.name}.claims")
    return list(module.CLAIMS)


def run_chapter(chapter: Path, kinds: tuple[str, ...] = KINDS,
                claims: list[Claim] | None = None) -> list[Result]:
    """Every claim of the chapter (or ``claims``); kinds not asked for are reported as skipped
    and not measured."""
    results = []
    for claim, stated in bind(chapter, claims):
        if claim.kind in kinds:
            results.append(evaluate(claim, stated, chapter))
        else:
            day = int(chapter.name[3:5])
            results.append(Result(claim, stated, "-",
                                  f"skipped: {claim.kind} (make chapter-{day})"))
    return results


def print_table(chapter: Path, results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (chapter / "README.md").read_text().splitlines()[0].lstrip("# ")
    table = Table(title=title, show_lines=False)
    for col in ("claim", "kind", "stated", "measured", "verdict"):
        table.add_column(col, overflow="fold")
    styles = {"pass": "green", "FAIL": "bold red", "error": "bold red"}
    for r in results:
        style = next((s for k, s in styles.items() if r.verdict.startswith(k)), "yellow")
        table.add_row(r.claim.row, r.claim.kind, r.stated, r.measured,
                      f"[{style}]{r.verdict}[/]")
    Console(width=160).print(table)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m chapters.runner",
                                 description="recompute a chapter's claims")
    ap.add_argument("day", help="a day number, or 'all'")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated kinds to run (default: all of {','.join(KINDS)})")
    args = ap.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {KINDS}")
    chapters = all_chapters() if args.day == "all" else [chapter_dir(args.day)]
    from chapters.common import hardware

    print(f"measuring {', '.join(kinds)} claims on {hardware()}")
    failed = errors = 0
    for ch in chapters:
        try:
            results = run_chapter(ch, kinds)
        except ChapterError as e:
            print(f"error: {e}", file=sys.stderr)
            errors += 1
            continue
        print_table(ch, results)
        failed += sum(r.failed for r in results)
    if failed:
        print(f"{failed} claim(s) did not hold", file=sys.stderr)
    if errors:
        print(f"{errors} chapter(s) could not be checked", file=sys.stderr)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
