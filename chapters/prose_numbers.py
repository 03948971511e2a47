"""Every number in a chapter's prose is accounted for, and every machine it names.

Why this module exists: ``make chapter-N`` recomputes the numbers table and nothing else, so a
number written anywhere else in the README (a sentence, a second table, a figure's caption) is
the writer's word, and it drifts or overstates the moment the code changes or the run moves to
another machine. This check reads files only (the README, and the numbers tables of the days
it names; no claim is measured, so it is cheap enough for every ``make test``) and lists every
number in the prose that is not accounted for. A number is accounted for when its value
appears in one of:

- a **stated cell** of the chapter's numbers table (``| claim | stated |``), the value a claim
  recomputes; for an exact claim that is also its measured text;
- a **row label** of that table: the label names the conditions of the measurement ("pool 96",
  "at 4 threads"), so its numbers are the chapter's declared inputs; a further column of the
  table (how a row is recomputed, what the original lab log said) is read the same way, since
  it stands beside the claim it qualifies;
- an **inputs paragraph**: a paragraph that begins ``Inputs:`` (or ``**Inputs:**``) and lists the
  workload, model and settings the chapter chose. Its numbers are declared, not measured;
- the numbers table of a chapter that the **same paragraph names** (``Day 30``, a link to
  ``../day30_...``): a number quoted from another day is that day's claim;
- a **quote**: a blockquote (lines starting ``>``), or a sentence (or clause, up to ``;`` or
  ``:``) that carries a marker ``(quoted from ...)`` saying where its numbers come from (the
  original lab log, a results file, another project's documentation), or a table whose header
  row carries that marker. Quoted numbers are not checked; the marker tells the reader that, too.

Values are compared as numbers: ``131,328`` and ``131328`` match, ``0.250`` and ``0.25``,
``1e-6`` and ``0.000001``; a unit glued on (``3.4x``, ``25%``, ``16k``, ``5-token``) is not part
of the value. A constant in a formula over named quantities (the 1 in ``T − 1``) is not a
measurement either.

Not numbers (exempt): day, week and chapter references (``Day 33``, ``Days 30-33``, ``Days 57
and 58``, ``Week 8``, ``chapter-33``), list and heading numbering, identifiers (a word that starts
with a letter: ``bf16``, ``r3``, ``H100``, ``Llama-3.2-1B``, ``AVX512``), version strings
(``2.13.0``) and dates (``2026-11-30``), code (fenced blocks and ``inline code``), link targets,
HTML comments, and the numbers table itself.

Machines: a processor or card named in the prose (``EPYC``, ``Xeon``, ``H100``, ...) must come from
the run, so the name must appear in a stated cell or a row label, or sit in a quote. Stating a
processor feature as a condition (AVX512-BF16, AMX) is not naming a machine.

    python -m chapters.prose_numbers            # every chapter; exits 1 on any finding
    python -m chapters.prose_numbers 33 50      # some chapters

``tests/test_prose_numbers.py`` runs it over every chapter.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from chapters.runner import _cells, all_chapters, chapter_dir

# A number: digits with thousands commas, a decimal part and an exponent. Not preceded by a word
# character or a dot (``fp32``, ``.5``), so identifiers are not split.
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_DAY_REF = re.compile(r"\b(?:[Dd]ays?|[Ww]eeks?|[Cc]hapters?)[\s-]\d+"
                      r"(?:\s*(?:[–—-]|,|, and|and|or|to|through)\s*\d+\b)*")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_VERSION = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?:[\w.+-]*)")
_DATE = re.compile(r"(?<!\w)\d{4}-\d{2}-\d{2}(?!\w)")
_LIST_MARK = re.compile(r"^\s*\d+[.)](?=\s)", re.M)
_INPUTS = re.compile(r"^\s*(?:\*\*)?Inputs(?:\*\*)?:|^\s*\*\*Inputs:\*\*")
# Names with a number in them that are written with a space: Llama 3.1, Python 3.11.
_NAMES = re.compile(r"\b(?:Llama|Python|CUDA|Zen)[ -]\d+(?:\.\d+)?"
                    r"(?:(?:,|\s+and|\s+or)\s*\d+\.\d+)*")
_QUOTED = re.compile(r"\(quoted\b")
_SENTENCE_END = re.compile(r"[.!?;:](?=\s|$)")
_CHAPTER_LINK = re.compile(r"\.\./day(\d\d)_")
_DAY_NAMED = re.compile(r"\b[Dd]ays?[\s-](\d+)((?:\s*(?:[–—-]|,|, and|and|or|to)\s*\d+\b)*)")
# Machines, not features: a name that says which computer ran something.
MACHINES = re.compile(r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Sapphire Rapids|Emerald Rapids|"
                      r"Granite Rapids|Ice Lake|Cascade Lake|Skylake|Genoa|Milan|Zen ?\d|"
                      r"Graviton\d?|Apple M\d|Core i\d|[AH]100|H200|GH200|B200|A10G?|L4|L40S?|"
                      r"RTX ?\d{4}|MI\d{3}X?|Grace Hopper|Neoverse)\b")


@dataclass(frozen=True, slots=True)
class Finding:
    chapter: str
    line: int
    what: str  # the number or the machine name, as written
    context: str

    def __str__(self) -> str:
        return f"{self.chapter}/README.md:{self.line}: {self.what!r} in: {self.context}"


def value(text: str) -> float | None:
    """The numeric value of a number as written: ``'131,328'`` -> 131328.0."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _values(text: str, code: bool = False) -> set[float]:
    """The numbers of ``text`` (with ``code``, those inside code spans too)."""
    out = set()
    for m in _NUMBER.finditer(_strip(text.replace("`", " ") if code else text, formulas=False)):
        v = value(m.group().rstrip(","))
        if v is not None:
            out.add(v)
    return out


def _blank(text: str, pattern: re.Pattern) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (columns kept)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _strip(text: str, formulas: bool = True) -> str:
    """The prose of a paragraph: code, link targets, references, identifiers and formula
    constants blanked out (columns kept, so positions still map to lines)."""
    for p in (_CODE_SPAN, _LINK_TARGET, _DATE, _VERSION, _NAMES, _DAY_REF):
        text = _blank(text, p)
    text = _blank(text, _LIST_MARK)
    out = list(text)
    # identifiers: a run of word characters, dots, hyphens that starts with a letter or _
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_.\-+/]*", text):
        out[m.start():m.end()] = " " * (m.end() - m.start())
    stripped = "".join(out)
    if not formulas:
        return stripped
    for m in _NUMBER.finditer(stripped):
        if _formula_constant(text, m.start(), m.end()):
            out[m.start():m.end()] = " " * (m.end() - m.start())
    return "".join(out)


def _formula_constant(text: str, start: int, end: int) -> bool:
    """``1`` in ``T − 1``, ``(P + 1)``, ``N(N − 1)/2`` or ``0..T``: a constant of a formula over
    named quantities, not a measurement. A hyphen counts as minus only with spaces around it
    (``5-token`` is an adjective, ``keys 0-4`` a range)."""
    head = text[:start].rstrip("*_(")
    m = re.search(r"(?:[+−×*/·]|\.\.|\s-)\s*$", head)
    if m:
        before = head[:m.start()].rstrip(" *_")
        if before and (before[-1].isalpha() or before[-1] in ")⁰¹²³⁴⁵⁶⁷⁸⁹"):
            return True
    m = re.match(r"\s*(?:[+−×*/·]|\.\.|\s-\s)", text[end:])
    if m:
        after = text[end:][m.end():].lstrip(" *_(")
        if after[:1].isalpha():
            return True
    return False


def _quoted_spans(text: str) -> str:
    """``text`` with every sentence that carries a ``(quoted ...)`` marker blanked out: from
    the end of the previous sentence to the end of the marker's own sentence."""
    out = list(text)
    for m in _QUOTED.finditer(text):
        depth, close = 0, m.start()
        while close < len(text):
            depth += {"(": 1, ")": -1}.get(text[close], 0)
            if depth == 0:
                break
            close += 1
        ends = [e.end() for e in _SENTENCE_END.finditer(text, 0, m.start())]
        start = ends[-1] if ends else 0
        end = _SENTENCE_END.search(text, close)
        stop = end.start() + 1 if end else len(text)
        for i in range(start, stop):
            if out[i] != "\n":
                out[i] = " "
    return "".join(out)


def _paragraphs(text: str) -> list[list[tuple[int, str]]]:
    """The README's prose as paragraphs of (line number, line): code blocks, comments and the
    numbers table removed."""
    text = _blank(text, _COMMENT)
    lines = text.splitlines()
    paras, current, fence, table = [], [], False, False
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence:
            continue
        if s.startswith("|"):
            if not table and _cells(line)[:2] == ["claim", "stated"]:
                table = True
            if table:
                continue
        else:
            table = False
        if not s:
            if current:
                paras.append(current)
            current = []
            continue
        current.append((n, line))
    if current:
        paras.append(current)
    # an indented code block: every line of the paragraph indented by four spaces or a tab
    return [p for p in paras if not all(ln.startswith(("    ", "\t")) for _, ln in p)]


def _accounted(chapter: Path) -> tuple[set[float], str]:
    """The values a chapter's numbers table states or names, and its text (for machine names)."""
    from chapters.runner import numbers_table

    numbers_table(chapter / "README.md")  # refuses a README without exactly one
    vals, text, inside = set(), [], False
    for line in (chapter / "README.md").read_text().splitlines():
        if line.lstrip().startswith("|"):
            inside = inside or _cells(line)[:2] == ["claim", "stated"]
            if inside:  # every cell: the label, the stated value, any column beside them
                for cell in _cells(line):
                    vals |= _values(cell, code=True)
                    text.append(cell)
        else:
            inside = False
    return vals, "\n".join(text)


_TABLES: dict[int, set[float]] = {}


def _day_table(day: int) -> set[float]:
    if day not in _TABLES:
        try:
            _TABLES[day] = _accounted(chapter_dir(day))[0]
        except (ValueError, OSError):
            _TABLES[day] = set()
    return _TABLES[day]


def _days_named(para: str) -> set[int]:
    days = {int(d) for d in _CHAPTER_LINK.findall(para)}
    for m in _DAY_NAMED.finditer(para):
        days.add(int(m.group(1)))
        days |= {int(d) for d in re.findall(r"\d+", m.group(2))}
    return days


def _where(para: list[tuple[int, str]], starts: list[int], pos: int) -> tuple[int, str]:
    """The README line number and text of character ``pos`` of a joined paragraph."""
    i = max(k for k, s in enumerate(starts[:-1]) if s <= pos)
    return para[i][0], para[i][1].strip()


def check(chapter: Path) -> list[Finding]:
    """Every number and machine name in ``chapter``'s README that nothing accounts for."""
    if not (chapter / "README.md").is_file():
        return [Finding(chapter.name, 0, "README.md", "the chapter has no README.md yet")]
    text = (chapter / "README.md").read_text()
    stated, table_text = _accounted(chapter)
    paras = _paragraphs(text)
    inputs = set()
    for para in paras:
        if _INPUTS.match(para[0][1]):
            inputs |= _values("\n".join(line for _, line in para), code=True)
    findings = []
    for para in paras:
        if _INPUTS.match(para[0][1]):
            continue
        if para[0][1].lstrip().startswith("|") and "(quoted" in para[0][1]:
            continue  # a table whose header says where it is quoted from
        lines = [("" if line.lstrip().startswith(">") else line) for _, line in para]
        joined = _quoted_spans("\n".join(lines))  # blockquotes and (quoted ...) say so
        known = stated | inputs
        for day in _days_named(joined):
            known |= _day_table(day)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        for m in MACHINES.finditer(_blank(joined, _CODE_SPAN)):
            if m.group() not in table_text:
                n, line = _where(para, starts, m.start())
                findings.append(Finding(chapter.name, n, m.group(), line))
        prose = re.sub(r"(?m)^(\s*#+\s*)(\d+(?:\.\d+)*\.?)(?=\s)",
                       lambda m: m.group(1) + " " * len(m.group(2)), joined)
        for m in _NUMBER.finditer(_strip(prose)):
            v = value(m.group().rstrip(","))
            if v is not None and v not in known:
                n, line = _where(para, starts, m.start())
                findings.append(Finding(chapter.name, n, m.group().rstrip(","), line))
    return findings


def main(argv: list[str]) -> int:
    chapters = [chapter_dir(a) for a in argv] if argv else all_chapters()
    findings = [f for ch in chapters for f in check(ch)]
    for f in findings:
        print(f)
    by = {}
    for f in findings:
        by[f.chapter] = by.get(f.chapter, 0) + 1
    if findings:
        print(f"{len(findings)} number(s) or machine name(s) unaccounted for in "
              f"{len(by)} chapter(s): " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())),
              file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
