"""``make site-test`` after ``make site`` runs only the browser; on a fresh clone it builds once.

Why this file exists: the book takes minutes to build, and CI calls only ``make site-test``. So
``site/build_book.py`` leaves build/site.stamp (the inputs' state when a whole build began) and
``--fresh`` compares it with the inputs now. These tests never build the book: they hold the
stamp's logic on a small tree, then run ``make -n site-test`` in a copy of the Makefiles with a
fake build and a stamp, and read which commands make would run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def build_book(tmp_path, monkeypatch):
    """site/build_book.py over a small tree of its own (not a git checkout)."""
    pytest.importorskip("nbformat")
    monkeypatch.syspath_prepend(str(ROOT / "site"))
    import build_book as module

    tree = tmp_path / "tree"
    (tree / "chapters").mkdir(parents=True)
    (tree / "chapters" / "a.md").write_text("one\n")
    monkeypatch.setattr(module, "ROOT", tree)
    monkeypatch.setattr(module, "BUILD", tree / "build")
    monkeypatch.setattr(module, "STAMP", tree / "build" / "site.stamp")
    return module


def fake_site(build: Path) -> None:
    (build / "site").mkdir(parents=True, exist_ok=True)
    (build / "site" / "index.html").write_text("<html></html>")
    (build / "book.json").write_text("{}")


def test_a_stamp_says_fresh_until_an_input_changes(build_book):
    tree = build_book.ROOT
    fresh, why = build_book.freshness()
    assert not fresh and "no build/site.stamp" in why
    fake_site(build_book.BUILD)
    build_book.write_stamp(build_book.inputs_state(), 1.0)
    fresh, why = build_book.freshness()
    assert fresh and "fresh" in why and "1 files" in why
    os.utime(tree / "chapters" / "a.md", (1, 1))  # touched, same content: still fresh
    assert build_book.freshness()[0]
    (tree / "chapters" / "a.md").write_text("two\n")
    fresh, why = build_book.freshness()
    assert not fresh and why.startswith("the files changed")
    (tree / "chapters" / "a.md").write_text("one\n")
    assert build_book.freshness()[0]
    (tree / "chapters" / "b.md").write_text("new\n")  # an added file counts too
    assert not build_book.freshness()[0]


def test_build_output_is_not_an_input(build_book):
    fake_site(build_book.BUILD)
    build_book.write_stamp(build_book.inputs_state(), 1.0)
    (build_book.BUILD / "site" / "extra.html").write_text("x")
    assert build_book.freshness()[0]


def test_a_stamp_without_its_site_is_not_fresh(build_book):
    fake_site(build_book.BUILD)
    build_book.write_stamp(build_book.inputs_state(), 1.0)
    shutil.rmtree(build_book.BUILD / "site")
    fresh, why = build_book.freshness()
    assert not fresh and "build/site/index.html is missing" in why


def test_the_tools_versions_are_part_of_the_state(build_book):
    fake_site(build_book.BUILD)
    state = build_book.inputs_state()
    build_book.write_stamp(state | {"tools": state["tools"] | {"torch": "0.0"}}, 1.0)
    fresh, why = build_book.freshness()
    assert not fresh and "the tools' versions changed" in why


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_n_site_test_builds_only_when_the_stamp_is_stale(tmp_path):
    """The Makefiles in a copy of the repository's top (no git there: the stamp hashes the
    tree), with .venv linked in and a fake build/site."""
    pytest.importorskip("nbformat")
    copy = tmp_path / "repo"
    (copy / "site").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, copy / name)
    for f in (ROOT / "site").iterdir():
        if f.is_file():
            shutil.copy2(f, copy / "site" / f.name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    (copy / "chapters").mkdir()
    (copy / "chapters" / "a.md").write_text("one\n")

    (copy / "setup.stamp").write_text("")  # newer than pyproject.toml: setup is done

    def make_n() -> str:
        r = subprocess.run(["make", "-n", "site-test", "CHROMIUM=/bin/true",
                            "VENV_STAMP=setup.stamp"], cwd=copy,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def builds(out: str) -> bool:
        return any(line.endswith("site/build_book.py") for line in out.splitlines())

    out = make_n()  # nothing built here yet: CI's fresh clone
    assert "no build/site.stamp" in out and builds(out) and "browser_check.py" in out
    fake_site(copy / "build")
    # what a finished `make site` leaves: the stamp of these inputs, made by the same code
    subprocess.run([sys.executable, "-c", "import build_book as b; b.write_stamp("
                    "b.inputs_state(), 1.0)"], cwd=copy / "site", check=True, timeout=60,
                   env=os.environ | {"PYTHONPATH": str(copy / "site")})
    assert json.loads((copy / "build" / "site.stamp").read_text())["inputs"]["files"] > 0
    out = make_n()
    assert "build/site is fresh" in out and not builds(out) and "browser_check.py" in out
    (copy / "chapters" / "a.md").write_text("two\n")
    out = make_n()
    assert "the files changed" in out and builds(out)
