"""The rules that keep the chapters a book rather than a lab notebook, checked from the files.

Why this module exists: a chapter is written once and then edited by every later day that
touches its code, and each edit is reasonable on its own: a sentence that says what Day 60
changed, a number quoted from a run elsewhere, a claim's text pasted into a sentence so that it
cannot drift. Together they turn a chapter into a running log that a reader cannot finish and
that leans on days the reader has not reached. These checks read the README (and the notebook's
markdown) only, so ``make test`` runs them on every chapter:

- **length**: a chapter's prose (code blocks, tables and comments aside) is under
  ``MAX_WORDS`` words, a length a reader finishes in one sitting;
- **quotes**: at most ``MAX_QUOTED`` ``(quoted from ...)`` asides; the rest of its numbers are
  claims that the runner recomputes;
- **later days**: the opening section (before the first ``##`` heading) names no later day,
  and the rest names one only after a heading in ``FORWARD_HEADINGS`` (``## What comes
  next``, ``## What changed since Day N``, ``## Since then``), so a reader meets every idea
  in order;
- **numbers as prose**: no number in bold (the one numbers table holds the exact value), and
  no claim's stated text pasted into a sentence when it is more than one number or bound
  (``95 compiled, 205 copied, 16 kept`` is a table cell, not a sentence);
- **since then**: what a later day changed about a chapter's work lives in the chapter's
  ``since_then.md`` (the book gathers a part's into one "Since then" page), short (under
  ``MAX_SINCE_WORDS`` words), each entry headed by the day that made the change, and with no
  measured number: the numbers live in that later day's table;
- **the notebook says what it prints**: a number in a notebook's markdown cell that is a
  measured value of its chapter (a stated cell, not an input) is written by hand where it
  should be printed from the claim's own function, and it is refused;
- **links the book can follow**: a relative link in README.md names another chapter, a module
  under ``nanoserve/`` (the book's API pages) or a file of the chapter itself, and it exists;
  a link to ``tests/`` or ``tools/`` would read on GitHub and break the book's strict build.

    python -m chapters.book_rules            # every chapter; exits 1 on any finding
    python -m chapters.book_rules 44 54      # some chapters
    python -m chapters.book_rules --words    # words and quotes per chapter

``tests/test_book_rules.py`` runs it over every chapter.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from chapters import prose_numbers as pn
from chapters.runner import is_bound, numbers_table

MAX_WORDS = 3500
MAX_QUOTED = 2
MAX_SINCE_WORDS = 300
FORWARD_HEADINGS = re.compile(r"^##\s+(What comes next|What changed since|Since then)", re.I)
_HEADING = re.compile(r"^#{2,}\s")
_DAY_OF = re.compile(r"day(\d\d)_")
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.S)
_LINK = re.compile(r"\]\(([^)\s#]+)")  # a markdown link's target, less any anchor
_ROOT = Path(__file__).resolve().parents[1]


def _day(chapter: Path) -> int:
    return int(_DAY_OF.match(chapter.name)[1])


def _unfenced(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside code fences and tables."""
    out, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith(("```", "~~~")):
            fence = not fence
        elif not (fence or s.startswith("|")):
            out.append((n, line))
    return out


def prose_text(text: str) -> str:
    """The README without code blocks, HTML comments and tables: what a reader reads."""
    return "\n".join(line for _, line in _unfenced(re.sub(r"<!--.*?-->", "", text, flags=re.S)))


def words(chapter: Path) -> int:
    """Words of prose: what a reader reads, with code and tables aside."""
    return len(prose_text((chapter / "README.md").read_text()).split())


def quoted(chapter: Path) -> int:
    """The "(quoted from ...)" asides, a line break inside the marker included."""
    return len(re.findall(r"\(quoted\s+from\b", (chapter / "README.md").read_text()))


def later_days(chapter: Path) -> list[tuple[int, str]]:
    """(line, text) of each line that names a later day before a forward heading."""
    day, found = _day(chapter), []
    for n, line in _unfenced((chapter / "README.md").read_text()):
        s = line.strip()
        if FORWARD_HEADINGS.match(s):
            break
        named = pn._days_named(pn._blank(line, pn._CODE_SPAN).replace("`", ""))
        named |= {int(d) for d in pn._CHAPTER_LINK.findall(line)}
        if any(d > day for d in named):
            found.append((n, s))
    return found


def bold_numbers(chapter: Path) -> list[tuple[int, str]]:
    """Bold spans of prose that hold a number (a day reference or an identifier aside)."""
    found = []
    text = prose_text((chapter / "README.md").read_text())
    for m in _BOLD.finditer(text):
        inner = pn._strip(m[1], formulas=False)
        if pn._NUMBER.search(inner):
            found.append((text.count("\n", 0, m.start()) + 1, m[0]))
    return found


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("**", "").replace("`", "")).strip()


def compound(stated: str) -> bool:
    """A stated text that is more than one number or one bound: a claim string that must stay in
    its table (a single number may appear in a sentence; it is accounted for by value)."""
    s = re.sub(r"(?<=\d),(?=\d{3})", "", stated.strip())  # 131,072 is one number
    if is_bound(s) or not re.search(r"\d", s):
        return False
    return bool(re.search(r"[,;]|->|→", s))


def pasted_claims(chapter: Path) -> list[str]:
    """Compound stated texts of the numbers table that also stand in the prose."""
    readme = chapter / "README.md"
    prose = _normal(prose_text(readme.read_text()))
    return [stated for stated in numbers_table(readme).values()
            if compound(stated) and _normal(stated) in prose]


def notebook_numbers(chapter: Path) -> list[tuple[int, str]]:
    """Numbers written in the notebook's markdown cells that are measured values of the
    chapter: stated cells, less what the row labels and the Inputs paragraph declare."""
    nb = chapter / "notebook.py"
    if not nb.is_file():
        return []
    readme = chapter / "README.md"
    rows = numbers_table(readme)
    measured = set().union(*(pn._values(s, code=True) for s in rows.values())) if rows else set()
    declared = set().union(*(pn._values(label, code=True) for label in rows)) if rows else set()
    for para in pn._paragraphs(readme.read_text()):
        if pn._INPUTS.match(para[0][1]):
            declared |= pn._values("\n".join(line for _, line in para), code=True)
    found, markdown = [], False
    for n, line in enumerate(nb.read_text().splitlines(), 1):
        if line.startswith("# %%"):
            markdown = "[markdown]" in line
            continue
        if not markdown or not line.startswith("#"):
            continue
        if re.match(r"#\s*#", line):
            continue  # a heading: its numbers are the notebook's section numbers
        for m in pn._NUMBER.finditer(pn._strip(line[1:])):
            v = pn.value(m.group().rstrip(","))
            if v is not None and v in measured - declared and (v >= 10 or v != int(v)):
                found.append((n, line.strip()))
    return found


def since_then(chapter: Path) -> list[str]:
    """Findings for the chapter's since_then.md: too long, an entry not headed by a later day,
    or a number that is not a day's."""
    path = chapter / "since_then.md"
    if not path.is_file():
        return []
    text, out, day = path.read_text(), [], _day(chapter)
    name = f"{chapter.name}/since_then.md"
    n = len(prose_text(text).split())
    if n >= MAX_SINCE_WORDS:
        out.append(f"{name}: {n} words; a since-then note is under {MAX_SINCE_WORDS}")
    heads = re.findall(r"^###\s+Day\s+(\d+)\b", text, re.M)
    if not heads or re.search(r"^#{1,2}\s", text, re.M):
        out.append(f"{name}: each entry is a '### Day N: what changed' heading (no # or ##)")
    out += [f"{name}: Day {h} is not later than Day {day}" for h in heads if int(h) <= day]
    for n_line, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        if pn._NUMBER.search(pn._strip(line)):
            out.append(f"{name}:{n_line}: a number; the later day's table holds it: {line[:80]}")
    return out


def dead_links(chapter: Path) -> list[tuple[int, str]]:
    """(line, target) for each relative link of README.md the book cannot render."""
    found = []
    for line, text in _unfenced((chapter / "README.md").read_text()):
        for target in _LINK.findall(text):
            if "://" in target or target.startswith(("/", "mailto:", "figures/")):
                continue
            src = (chapter / target).resolve()
            folder = src.parent if src.name == "README.md" else src
            rendered = ((folder.parent == _ROOT / "chapters" and folder.is_dir())
                        or (src.suffix == ".py" and src.is_relative_to(_ROOT / "nanoserve"))
                        or src.is_relative_to(chapter.resolve()))
            if not (rendered and src.exists()):
                found.append((line, target))
    return found


def check(chapter: Path) -> list[str]:
    """Every finding for one chapter, as a line to print."""
    name, out = chapter.name, since_then(chapter)
    n = words(chapter)
    if n >= MAX_WORDS:
        out.append(f"{name}: {n:,} words of prose; a chapter is under {MAX_WORDS:,}")
    q = quoted(chapter)
    if q > MAX_QUOTED:
        out.append(f"{name}: {q} '(quoted from' asides; at most {MAX_QUOTED}")
    for line, text in later_days(chapter):
        out.append(f"{name}/README.md:{line}: names a later day before '## What comes next' "
                   f"(or '## What changed since' / '## Since then'): {text[:100]}")
    for line, text in bold_numbers(chapter):
        out.append(f"{name}/README.md (prose line {line}): a number in bold: {text[:80]}")
    for stated in pasted_claims(chapter):
        out.append(f"{name}/README.md: the claim text {stated!r} stands in a sentence; "
                   f"write the sentence in words, the table holds the exact value")
    for line, text in notebook_numbers(chapter):
        out.append(f"{name}/notebook.py:{line}: a measured value written by hand in a "
                   f"markdown cell; print it from the claim instead: {text[:80]}")
    for line, target in dead_links(chapter):
        out.append(f"{name}/README.md:{line}: a link the book cannot follow ({target}): "
                   f"link a chapter, a nanoserve module or a file of this chapter")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--words"]:
        for ch in pn.all_chapters():
            print(f"{ch.name:32s} {words(ch):6,d} words  {quoted(ch)} quoted")
        return 0
    chapters = [pn.chapter_dir(a) for a in argv] if argv else pn.all_chapters()
    findings = [f for ch in chapters for f in check(ch)]
    for f in findings:
        print(f)
    if findings:
        print(f"{len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
