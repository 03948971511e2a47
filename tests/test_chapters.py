"""Every chapter's claims hold on this machine, and every stated value can make them fail.

This is how CI guards the book's numbers. The stated values live only in each README's numbers
table; ``chapters.runner`` pairs every row with its claim and judges the measurement against the
row's text. Here, for every chapter:

- the table and claims.py pair up exactly (no row unchecked, no claim without a row);
- every exact, bound and results-backed claim holds (timed claims are never run by
  ``make test``: ``make chapter-N``, ``make chapters``, ``make site`` and ``make bench`` run
  them, and the terminal summary says how many were left to them);
- editing any one stated cell makes the chapter fail. Each chapter is measured once per process;
  every cell is then edited in a copy of the README by the rule of
  ``chapters.runner.contradictions``, the copy is parsed back, and the verdict is re-judged on the
  cached measurement. Timed rows are re-judged on a synthetic measurement that satisfies them
  (``satisfying``), so this checks their parsing and comparison without timing anything.
- One end-to-end run of ``python -m chapters.runner 30`` on a temporary copy of ``chapters/``
  with one README cell edited shows the command itself exit non-zero.

    .venv/bin/python -m pytest -q tests/test_chapters.py -k edit
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chapters import runner
from chapters.runner import (
    ChapterError,
    all_chapters,
    bind,
    bound,
    contradictions,
    exact,
    gpu,
    numbers_table,
    parse_bound,
    recorded,
    run_chapter,
    satisfying,
    timed,
)

CHAPTERS = all_chapters()
CHECKED = ("exact", "bound", "gpu", "recorded")  # what make test measures; never "timed"


@functools.cache
def results(chapter: Path) -> tuple[runner.Result, ...]:
    """One measurement of the chapter per process, shared by the tests below."""
    return tuple(run_chapter(chapter, CHECKED))


def test_there_are_chapters():
    assert len(CHAPTERS) >= 4


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_layout(chapter):
    for name in ("README.md", "notebook.py", "diagram.py", "claims.py"):
        assert (chapter / name).is_file(), f"{chapter.name} has no {name}"
    assert (chapter / "snapshot" / "__init__.py").is_file()
    first = (chapter / "README.md").read_text().splitlines()[0]
    day = int(chapter.name[3:5])
    assert first.startswith(f"# Day {day}: "), first


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_numbers_table_and_claims_pair_up(chapter):
    pairs = bind(chapter)  # raises ChapterError on any row or claim left over
    assert pairs and len(pairs) == len(numbers_table(chapter / "README.md"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_claims_hold(chapter):
    rs = results(chapter)
    bad = [(r.claim.row, r.stated, r.measured, r.verdict) for r in rs if r.failed]
    assert not bad, bad
    for r in rs:
        if r.claim.kind == "timed":  # never measured here
            assert r.verdict.startswith("skipped: timed") and r.value is None, r
        if r.claim.kind == "gpu" and not runner._gpu_available():
            assert r.verdict.startswith(("skipped", "pass from results (")), \
                f"a GPU claim passed without a GPU: {r}"


def _edit_cell(text: str, label: str, new: str) -> str:
    """The README with the stated cell of the row ``label`` replaced by ``new``."""
    out, done = [], 0
    for line in text.splitlines(keepends=True):
        cells = re.split(r"(?<!\\)\|", line.strip())
        if (line.lstrip().startswith("|") and len(cells) > 3
                and cells[1].strip().replace("\\|", "|") == label):
            cells[2] = f" {new} "
            line = "|".join(cells) + "\n"
            done += 1
        out.append(line)
    assert done == 1, f"row {label!r} found {done} times"
    return "".join(out)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_editing_any_stated_cell_fails(chapter):
    readme = chapter / "README.md"
    text = readme.read_text()
    checked = unjudged = 0
    for r in results(chapter):
        claim, stated = r.claim, r.stated
        if claim.kind == "timed" or r.value is None:
            if not claim.compares_as_bound(stated):
                unjudged += 1  # an exact GPU row with no results here: nothing to judge it on
                continue
            measured = satisfying(stated)  # synthetic: timed claims are not timed in make test
            assert claim.holds(stated, measured), (claim.row, stated, measured)
        else:
            measured = r.value
        for edit in contradictions(claim, stated, measured):
            reread = numbers_table(readme, _edit_cell(text, claim.row, edit))[claim.row]
            assert reread == edit
            assert not claim.holds(reread, measured), \
                f"{chapter.name}: row {claim.row!r} edited to {edit!r} still passes on {measured!r}"
        checked += 1
    assert checked + unjudged == len(numbers_table(readme)) and checked > unjudged


def test_an_edited_readme_makes_the_chapter_command_fail(tmp_path):
    """End to end, on a copy of chapters/: Day 30 passes as it is, fails with one cell edited."""
    shutil.copytree(runner.CHAPTERS, tmp_path / "chapters",
                    ignore=shutil.ignore_patterns("__pycache__", "results"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def chapter_30():
        return subprocess.run([sys.executable, "-m", "chapters.runner", "30"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)

    ok = chapter_30()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    readme = next((tmp_path / "chapters").glob("day30_*")) / "README.md"
    label = "24 requests through 8 slots: forward passes, scheduled"
    readme.write_text(_edit_cell(readme.read_text(), label, "45"))
    bad = chapter_30()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL" in bad.stdout and "1 claim(s) did not hold" in bad.stderr


# ---------------------------------------------------------------------------- the machinery


@pytest.mark.parametrize("text,inside,outside", [
    ("< 60 s", 59.99, 60.0),
    ("≤ 1e-5", 1e-5, 1.01e-5),
    ("<= 0.02", 0.02, 0.0201),
    ("≥ 3x", 3.0, 2.99),
    ("> 1x", 1.001, 1.0),
    ("at most 1e-5", 1e-5, 2e-5),
    ("at least 25%", 0.25, 0.2499),
    ("< 2 ms", 0.0019, 0.002),
    ("≥ 1,000", 1000, 999),
])
def test_bounds_are_parsed_with_their_strictness_and_unit(text, inside, outside):
    b = parse_bound(text)
    assert b.holds(inside) and not b.holds(outside)
    assert parse_bound(b.text()) == b


@pytest.mark.parametrize("text", ["3x", "about 3x", "≥ x", "≤ 1e-5 or so", "~ 2 s", "≥ 3 GB"])
def test_text_that_is_not_a_bound_is_refused(text):
    with pytest.raises(ChapterError, match="is not a bound"):
        parse_bound(text)


@pytest.mark.parametrize("stated,measured", [("≤ 1e-6", 0.0), ("< 60 s", 6.1), ("≥ 3x", 5.2),
                                             ("> 1x", 1.7), ("at least 25%", 0.4)])
def test_contradictions_of_a_bound_fail(stated, measured):
    claim = bound("x", lambda: measured)
    assert claim.holds(stated, measured)
    edits = contradictions(claim, stated, measured)
    assert len(edits) == 2 and not any(claim.holds(e, measured) for e in edits)


def _chapter(tmp_path: Path, rows: list[tuple[str, str]], extra: str = "") -> Path:
    ch = tmp_path / "day99_test"
    ch.mkdir(exist_ok=True)
    table = "\n".join(f"| {a} | {b} |" for a, b in rows)
    (ch / "README.md").write_text(f"# Day 99: Test\n\n| claim | stated |\n|---|---|\n{table}\n"
                                  f"{extra}")
    return ch


def test_a_table_row_can_be_read_back(tmp_path):
    ch = _chapter(tmp_path, [("a \\| b", "1"), ("c", "≤ 2")])
    pairs = bind(ch, [exact("a | b", lambda: 1), bound("c", lambda: 1.5)])
    assert [s for _, s in pairs] == ["1", "≤ 2"]
    assert [runner.evaluate(c, s, ch).verdict for c, s in pairs] == ["pass", "pass"]


@pytest.mark.parametrize("rows,claims,problem", [
    ([("a", "1")], ["a", "b"], "claim 'b' has no row"),
    ([("a", "1"), ("b", "2")], ["a"], "row 'b' is checked by no claim"),
    ([("a", "1"), ("a", "2")], ["a"], "name more than one row"),
    ([("a", "1")], ["a", "a"], "two claims check the row 'a'"),
])
def test_rows_and_claims_that_do_not_pair_are_refused(tmp_path, rows, claims, problem):
    ch = _chapter(tmp_path, rows)
    with pytest.raises(ChapterError, match=re.escape(problem)):
        bind(ch, [exact(name, lambda: 1) for name in claims])


def test_a_stated_value_in_claims_py_is_refused():
    with pytest.raises(ValueError, match="lives in README.md"):
        exact("blocks paging allocates", "129", lambda: 129)


def test_a_bound_claim_on_a_row_that_states_no_bound_is_refused(tmp_path):
    ch = _chapter(tmp_path, [("a", "3x")])
    with pytest.raises(ChapterError, match="is not a bound"):
        bind(ch, [bound("a", lambda: 3.0)])


def test_a_readme_needs_exactly_one_numbers_table(tmp_path):
    ch = _chapter(tmp_path, [("a", "1")], extra="\n| claim | stated |\n|---|---|\n| b | 2 |\n")
    with pytest.raises(ChapterError, match="2 tables"):
        bind(ch, [exact("a", lambda: 1), exact("b", lambda: 2)])
    (ch / "README.md").write_text("# Day 99: Test\n\nno table\n")
    with pytest.raises(ChapterError, match="0 tables"):
        bind(ch, [])


def test_a_timed_claim_is_left_to_the_chapter_command(tmp_path):
    ch = _chapter(tmp_path, [("t", "≥ 2x"), ("e", "1")])
    ran = []
    claims = [timed("t", lambda: ran.append("t") or 3.0), exact("e", lambda: ran.append("e") or 1)]
    in_make_test = run_chapter(ch, CHECKED, claims)
    assert [r.verdict for r in in_make_test] == ["skipped: timed (make chapter-99)", "pass"]
    assert ran == ["e"]
    in_make_chapter = run_chapter(ch, claims=claims)
    assert [r.verdict for r in in_make_chapter] == ["pass", "pass"] and ran == ["e", "t", "e"]


GPU_RESULT = {"device": "NVIDIA H200", "torch": "2.13.0", "cuda": "12.8", "date": "2026-11-30",
              "command": "make bench", "values": {"tok_s": 9500.0}}


def _gpu_chapter(tmp_path: Path, data: dict | None, stated: str = "≥ 9,000") -> Path:
    ch = _chapter(tmp_path, [("decode tokens/s", stated)])
    if data is not None:
        (ch / "results").mkdir(exist_ok=True)
        (ch / "results" / "decode.json").write_text(json.dumps(data))
    return ch


def _gpu_verdict(ch: Path) -> runner.Result:
    (pair,) = bind(ch, [gpu("decode tokens/s", "decode.json", "tok_s", measure=lambda: 1.0)])
    return runner.evaluate(*pair, ch)


def test_gpu_claims_on_a_cpu(tmp_path, monkeypatch):
    """The guard works without a card: never a bare pass, and results must name the machine."""
    monkeypatch.setattr(runner, "_gpu_available", lambda: False)
    r = _gpu_verdict(_gpu_chapter(tmp_path, None))
    assert r.verdict == "skipped: needs a GPU" and not r.failed
    r = _gpu_verdict(_gpu_chapter(tmp_path, GPU_RESULT))
    assert r.verdict == "pass from results (NVIDIA H200, 2026-11-30)", r
    r = _gpu_verdict(_gpu_chapter(tmp_path, GPU_RESULT, stated="≥ 10,000"))
    assert r.verdict.startswith("FAIL from results") and r.blocking
    for missing in ("device", "torch", "cuda", "date", "command"):
        data = {k: v for k, v in GPU_RESULT.items() if k != missing}
        r = _gpu_verdict(_gpu_chapter(tmp_path, data))
        assert r.verdict.startswith("error") and missing in r.verdict and r.failed
    r = _gpu_verdict(_gpu_chapter(tmp_path, {**GPU_RESULT, "values": {}}))
    assert r.verdict.startswith("error") and "tok_s" in r.verdict


def test_gpu_claims_on_a_card_are_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_gpu_available", lambda: True)
    monkeypatch.setattr(runner, "_device_name", lambda: "NVIDIA H200")
    ch = _gpu_chapter(tmp_path, None)
    (pair,) = bind(ch, [gpu("decode tokens/s", "decode.json", "tok_s", measure=lambda: 9100.0)])
    assert runner.evaluate(*pair, ch).verdict == "pass (on NVIDIA H200)"


def test_recorded_claims_name_their_machine_and_command(tmp_path):
    ch = _chapter(tmp_path, [("soak: requests lost", "0")])
    (ch / "results").mkdir()
    data = {"machine": "2-core CPU", "date": "2026-11-30", "command": "make soak",
            "values": {"lost": 0}}
    (ch / "results" / "soak.json").write_text(json.dumps(data))
    (pair,) = bind(ch, [recorded("soak: requests lost", "soak.json", "lost")])
    assert runner.evaluate(*pair, ch).verdict == "pass from results (2-core CPU, 2026-11-30)"
    (ch / "results" / "soak.json").write_text(json.dumps({**data, "command": ""}))
    assert runner.evaluate(*pair, ch).verdict.startswith("error")


def test_a_failing_timed_claim_does_not_block(tmp_path):
    ch = _chapter(tmp_path, [("t", "≥ 2x"), ("e", "1")])
    pairs = bind(ch, [timed("t", lambda: 1.0), exact("e", lambda: 2)])
    t, e = (runner.evaluate(c, s, ch) for c, s in pairs)
    assert t.failed and not t.blocking
    assert e.failed and e.blocking


def test_the_site_build_fails_on_a_failing_claim_but_not_on_a_timed_one(tmp_path, monkeypatch):
    """site/build_book.py's numbers table: every verdict shown; only non-timed failures fatal;
    the page shows it in the README's place, the one table on the page."""
    pytest.importorskip("nbconvert")
    monkeypatch.syspath_prepend(str(runner.CHAPTERS.parent / "site"))
    import build_book

    ch = _chapter(tmp_path, [("t", "≥ 2x"), ("e", "1")])
    chapter = build_book.Chapter(ch, 99, "Day 99: Test")
    pairs = [(timed("t", lambda: 1.0), "≥ 2x"), (exact("e", lambda: 1), "1")]
    monkeypatch.setattr(runner, "run_chapter",
                        lambda path: [runner.evaluate(c, s, path) for c, s in pairs])
    table, fatal = build_book.numbers_table(chapter)
    assert "| t | ≥ 2x | 1.00x | FAIL (timed) |" in table and fatal == []
    pairs[1] = (exact("e", lambda: 2), "1")
    table, fatal = build_book.numbers_table(chapter)
    assert "| e | 1 | 2 | FAIL |" in table and len(fatal) == 1
    page = build_book.with_numbers((ch / "README.md").read_text(), table)
    assert page.count("| claim |") == 1 and "| claim | stated | measured | verdict |" in page
    assert page.index("| e | 1 | 2 | FAIL |") > page.index("# Day 99")


def test_a_claim_this_machine_cannot_make_is_skipped_with_its_reason(tmp_path):
    ch = tmp_path / "day99_x"
    ch.mkdir()
    (ch / "README.md").write_text("# Day 99\n\n| claim | stated |\n|---|---|\n| a | 1 |\n"
                                  "| b | 2 |\n")
    ran = []
    claims = [runner.exact("a", lambda: ran.append("a") or 1, needs=lambda: "no such unit"),
              runner.exact("b", lambda: ran.append("b") or 2, needs=lambda: None)]
    rs = runner.run_chapter(ch, claims=claims)
    assert [r.verdict for r in rs] == ["skipped: no such unit", "pass"] and ran == ["b"]
    assert not any(r.failed for r in rs)
