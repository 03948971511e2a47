"""Every chapter's claims hold on this machine, and every stated value is in the chapter's prose.

This is how CI guards the book's numbers: `make test` runs each claim (GPU claims are skipped
without CUDA, never passed) and fails if one does not hold or if README.md does not state it.
"""

from __future__ import annotations

import pytest

from chapters.runner import all_chapters, load_claims, run_chapter

CHAPTERS = all_chapters()


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
def test_stated_values_appear_in_readme(chapter):
    prose = (chapter / "README.md").read_text()
    missing = [c.stated for c in load_claims(chapter) if c.stated not in prose]
    assert not missing, f"{chapter.name}/README.md does not state {missing}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_claims_hold(chapter):
    results = run_chapter(chapter)
    bad = [(r.claim.name, r.claim.stated, r.measured, r.verdict) for r in results if r.failed]
    assert not bad, bad
    assert not any(r.verdict == "pass" for r in results if r.claim.needs_gpu
                   and not r.verdict.startswith("pass (")), "a GPU claim passed without a GPU"
