"""The book reads as a book: every chapter keeps chapters/book_rules.py's rules, each rule
catches what it is for, and the home page and the parts give a reader a path through it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chapters import book_rules
from chapters.runner import CHAPTERS, all_chapters

SITE = CHAPTERS.parent / "site"


@pytest.mark.parametrize("chapter", all_chapters(), ids=lambda p: p.name)
def test_every_chapter_keeps_the_book_rules(chapter):
    assert book_rules.check(chapter) == []


def _chapter(tmp_path: Path, prose: str, rows=(("blocks", "129"),), day: int = 40,
             notebook: str | None = None, since: str | None = None) -> Path:
    ch = tmp_path / f"day{day}_test"
    ch.mkdir(parents=True)
    table = "\n".join(f"| {a} | {b} |" for a, b in rows)
    (ch / "README.md").write_text(f"# Day {day}: Test\n\n{prose}\n\n## Numbers\n\n"
                                  f"| claim | stated |\n|---|---|\n{table}\n")
    if notebook is not None:
        (ch / "notebook.py").write_text(notebook)
    if since is not None:
        (ch / "since_then.md").write_text(since)
    return ch


def test_a_clean_chapter_has_no_finding(tmp_path):
    ch = _chapter(tmp_path, "Day 31 built the engine; it holds 129 blocks.\n\n## What was built\n\n"
                  "Text.\n\n## What comes next\n\nDay 41 cuts prompts into chunks.")
    assert book_rules.check(ch) == []


def test_a_later_day_in_the_opening_or_the_body_is_caught(tmp_path):
    ch = _chapter(tmp_path, "As Day 57 will show, this is slow.\n\n## How it works\n\n"
                  "Text.")
    assert any("later day" in f and "Day 57" in f for f in book_rules.check(ch))
    body = _chapter(tmp_path / "b", "Opening.\n\n## How it works\n\nSee "
                    "[the kernel](../day60_paged_kernel/README.md).")
    assert any("later day" in f for f in book_rules.check(body))


def test_a_claim_string_pasted_into_a_sentence_is_caught(tmp_path):
    rows = (("hash calls", "18, one per full block"), ("blocks", "129"))
    ch = _chapter(tmp_path, "The run makes 18, one per full block `hash_block` calls.", rows)
    assert any("stands in a sentence" in f for f in book_rules.check(ch))
    fixed = _chapter(tmp_path / "b", "The run hashes each of its 18 full blocks once.", rows)
    assert book_rules.check(fixed) == []


def test_a_number_in_bold_is_caught(tmp_path):
    ch = _chapter(tmp_path, "The pool holds **129 blocks**.")
    assert any("in bold" in f for f in book_rules.check(ch))
    assert book_rules.check(_chapter(tmp_path / "b", "**Price per step.** It holds 129.")) == []


def test_too_many_quotes_and_too_many_words_are_caught(tmp_path):
    quotes = " ".join(f"It ran {n} s (quoted\nfrom a log)." for n in range(3))
    assert any("quoted" in f for f in book_rules.check(_chapter(tmp_path, quotes)))
    long = _chapter(tmp_path / "b", "word " * book_rules.MAX_WORDS)
    assert any("words of prose" in f for f in book_rules.check(long))


def test_a_measured_value_written_by_hand_in_the_notebook_is_caught(tmp_path):
    nb = "# %% [markdown]\n# The pool ends up holding 129 blocks.\n\n# %%\nprint(1)\n"
    ch = _chapter(tmp_path, "It holds 129 blocks.", notebook=nb)
    assert any("notebook.py:2" in f for f in book_rules.check(ch))
    ok = "# %% [markdown]\n# The pool's size, printed by the claim:\n\n# %%\nprint(129)\n"
    assert book_rules.check(_chapter(tmp_path / "b", "It holds 129 blocks.", notebook=ok)) == []


def test_a_since_then_note_is_short_dated_and_without_numbers(tmp_path):
    good = "### Day 55: the read moved into C++\n\nThe loop became one op.\n"
    assert book_rules.check(_chapter(tmp_path, "Text.", since=good)) == []
    bad = "### Day 12: earlier\n\nIt became 3.4x faster.\n"
    found = book_rules.check(_chapter(tmp_path / "b", "Text.", since=bad))
    assert any("not later" in f for f in found) and any("a number" in f for f in found)


def test_the_parts_hold_every_chapter_in_order_and_the_home_page_says_where_to_start():
    sys.path.insert(0, str(SITE))
    try:
        import build_book
    finally:
        sys.path.remove(str(SITE))
    parts = build_book.PARTS
    assert all(parts[i][1] + 1 == parts[i + 1][0] for i in range(len(parts) - 1))
    for ch in build_book.find_chapters():
        assert ch.part  # every day falls in one part
    names = [p for _, _, p, _ in parts]
    assert names.index("Speed on a CPU") > names.index("Batching and scheduling")
    home = (SITE / "home.md").read_text()
    assert "## Where to start" in home and "day01_llama_forward" in home
    assert "Why the day numbers skip" in home
    assert (CHAPTERS / "looking_back" / "README.md").is_file()


def test_the_roofline_is_read_before_the_speed_chapters():
    roofline = [p for p in CHAPTERS.glob("day*_roofline")]
    assert len(roofline) == 1
    day = int(roofline[0].name[3:5])
    speed = [int(p.name[3:5]) for p in all_chapters() if 49 <= int(p.name[3:5]) <= 55]
    assert speed and day < min(speed)


def test_a_link_the_book_cannot_follow_is_caught(tmp_path):
    ch = _chapter(tmp_path, "Opening.\n\n## What was built\n\nSee [the test]"
                  "(../../tests/test_families.py), [the frozen copy](snapshot/a.py) and "
                  "[a missing file](snapshot/gone.py).")
    (ch / "snapshot").mkdir()
    (ch / "snapshot" / "a.py").write_text("")
    found = book_rules.dead_links(ch)
    assert [t for _, t in found] == ["../../tests/test_families.py", "snapshot/gone.py"]
    assert any("cannot follow" in f for f in book_rules.check(ch))
    day69 = next(CHAPTERS.glob("day69_*"))  # links to nanoserve modules and other chapters
    assert book_rules.dead_links(day69) == []
