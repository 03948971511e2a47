"""Assemble the book from chapters/ and build it with mkdocs-material.

Why this exists: a chapter is written once, as files that also serve the code (README.md,
diagram.py, notebook.py, claims.py); the book is those files run and put together. For each
chapter this script

1. runs ``diagram.py`` (MPLBACKEND=Agg), which writes PNGs into build/figures/<chapter>/;
2. recomputes the claims with ``chapters.runner`` (timed ones included) and renders them as a
   markdown table with each verdict; a failing claim that is not timed makes the build exit 1
   once every page is written, a failing timed claim only warns;
3. executes ``notebook.py`` in a fresh kernel and renders it with its outputs;
4. writes build/docs/chapters/<chapter>/index.md: the prose, the claims, the notebook, with the
   figures copied next to it so that the README's ``figures/<name>.png`` links resolve.

Then it writes the home page, one API page per module found in nanoserve/, and build/book.json
(the nav, read by hooks.py, and the chapter list, read by browser_check.py), and runs
``mkdocs build --strict`` into build/site/.

A whole build takes minutes, so a finished one leaves build/site.stamp: the state of its
inputs when it started (every file git tracks or would track, by content, and the versions of
Python and the packages that run the book). ``--fresh`` compares that record with the inputs as
they are now and exits 0 only when they match and build/site is there, which is how
``make site-test`` after ``make site`` goes straight to the browser. The stamp is removed when
a build starts and written only when a whole build (mkdocs and notebooks included) succeeds.

    .venv/bin/python site/build_book.py              # what `make site` runs
    .venv/bin/python site/build_book.py --no-mkdocs  # only write build/docs/
    .venv/bin/python site/build_book.py --fresh      # exit 0 if build/site is current
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import nbformat
import notebooks

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
BUILD = ROOT / "build"
DOCS = BUILD / "docs"
PACKAGE = ROOT / "nanoserve"
STAMP = BUILD / "site.stamp"
# what runs the book besides its own files; a new version of any of them is a new build
TOOLS = ("torch", "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python",
         "nbformat", "nbconvert", "nbclient", "ipykernel", "jupytext", "matplotlib")

# (first day, last day, phase): a chapter belongs to the phase whose range holds its day.
PHASES = [
    (1, 13, "The model"),
    (14, 29, "Memory"),
    (30, 42, "Batching and the scheduler"),
    (43, 48, "Serving"),
    (49, 10**6, "Benchmark and optimise"),
]
TITLE = re.compile(r"# Day (\d+): (.+)")
LINK = re.compile(r"(\]\()([^)\s#]+)([^)\s]*)")  # ](target#anchor "title"  -> groups 1, 2, 3


@dataclass(frozen=True, slots=True)
class Chapter:
    path: Path
    day: int
    title: str  # "Day 7: The KV cache", as the README's first line says

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def page(self) -> str:
        return f"chapters/{self.name}/index.md"

    @property
    def phase(self) -> str:
        return next(p for lo, hi, p in PHASES if lo <= self.day <= hi)


def find_chapters() -> list[Chapter]:
    chapters = []
    for path in sorted((ROOT / "chapters").glob("day[0-9][0-9]_*")):
        readme = path / "README.md"
        if not readme.is_file():
            continue
        first = readme.read_text().splitlines()[0]
        m = TITLE.fullmatch(first.strip())
        if not m:
            raise SystemExit(f"{readme}: the first line must read '# Day N: Title', not {first!r}")
        chapters.append(Chapter(path, int(m[1]), f"Day {m[1]}: {m[2]}"))
    return sorted(chapters, key=lambda c: c.day)


def run_diagram(ch: Chapter) -> list[Path]:
    """Run the chapter's diagram.py from the repository root; return the PNGs it left."""
    script = ch.path / "diagram.py"
    if script.is_file():
        env = dict(os.environ, MPLBACKEND="Agg")
        subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, check=True)
    return sorted((BUILD / "figures" / ch.name).glob("*.png"))


def referenced_figures(ch: Chapter, figures: list[Path]) -> list[str]:
    """The figures/<name>.png that README.md shows; each must be one that diagram.py wrote."""
    shown = re.findall(r"\]\(figures/([^)\s]+)", (ch.path / "README.md").read_text())
    absent = sorted(set(shown) - {p.name for p in figures})
    if absent:
        raise SystemExit(f"{ch.path}/README.md shows {absent}, which diagram.py did not write "
                         f"into build/figures/{ch.name}/")
    return list(dict.fromkeys(shown))


def cell(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else "this machine's CPU"


def claims_table(ch: Chapter) -> tuple[str, list[str]]:
    """The chapter's claims as a markdown table, every kind measured (timed ones included), and
    the failures that must fail the build: any failing claim that is not timed. A failing timed
    claim is shown and warned about, never fatal: load on a shared machine is not a bug."""
    from chapters.runner import ChapterError, run_chapter

    try:
        results = run_chapter(ch.path)
    except ChapterError as e:
        return f"## Claims\n\n**error:** {cell(e)}\n", [f"{ch.title}: {e}"]
    rows = ["| claim | kind | stated | measured | verdict |", "|---|---|---|---|---|"]
    fatal = []
    for r in (r for r in results if r.failed):
        line = f"{ch.title}: {r.claim.kind} claim {r.claim.row!r} {r.verdict}: {r.measured}"
        print(f"  {'error' if r.blocking else 'warning'}: {line}")
        if r.blocking:
            fatal.append(line)
    for r in results:
        rows.append(f"| {cell(r.claim.row)} | {r.claim.kind} | {cell(r.stated)} "
                    f"| {cell(r.measured)} | {cell(r.verdict)} |")
    intro = (f"Every number this chapter states, recomputed when this page was built "
             f"({time.strftime('%Y-%m-%d')}, on {cpu_name()}, torch {version('torch')}). "
             "Timed claims are wall-clock ratios on that machine; a failing one is shown but "
             "does not fail the build. GPU numbers come from the measurements committed in the "
             "chapter's `results/` and name their hardware; a GPU number with no measurement is "
             f"*skipped*. `make chapter-{ch.day}` prints the same table.")
    return f"## Claims\n\n{intro}\n\n" + "\n".join(rows) + "\n", fatal


def rewrite_links(ch: Chapter, text: str, page_dir: Path, notebook_shown: bool) -> str:
    """Point the README's relative links at what the book has in their place.

    Another chapter (its folder or README.md) becomes its page, a nanoserve module its API page,
    notebook.py the executed notebook below; any other file of this chapter (snapshot/...,
    results/...) is copied next to the page.
    """
    def fix(m: re.Match) -> str:
        target = m[2]
        if "://" in target or target.startswith(("/", "mailto:", "figures/")):
            return m[0]
        src = (ch.path / target).resolve()
        if src == ch.path / "notebook.py" and notebook_shown:
            return f"{m[1]}#the-notebook"
        chapter = src.parent if src.name == "README.md" else src
        if chapter.parent == ROOT / "chapters" and chapter.is_dir():
            return f"{m[1]}../{chapter.name}/index.md{m[3]}"
        if src.suffix == ".py" and src.is_relative_to(PACKAGE):
            return f"{m[1]}../../api/{module_name(src)}.md{m[3]}"
        if src.is_file() and src.is_relative_to(ch.path) and src.suffix != ".md":
            dest = page_dir / src.relative_to(ch.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        return m[0]

    return LINK.sub(fix, text)


def write_chapter(ch: Chapter, figures: list[Path], execute: bool) -> list[str]:
    """Write the chapter's page; return its failing claims (see claims_table)."""
    page_dir = DOCS / "chapters" / ch.name
    (page_dir / "figures").mkdir(parents=True, exist_ok=True)
    for png in figures:
        shutil.copy2(png, page_dir / "figures" / png.name)
    source = ch.path / "notebook.py"
    shown = source.is_file() and execute
    parts = [rewrite_links(ch, (ch.path / "README.md").read_text(), page_dir, shown).rstrip()]
    fatal: list[str] = []
    if (ch.path / "claims.py").is_file():
        table, fatal = claims_table(ch)
        parts.append(table)
    if shown:
        nb = notebooks.execute(source, ROOT)
        (BUILD / "notebooks").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, BUILD / "notebooks" / f"{ch.name}.ipynb")
        notebooks.demote_headings(nb, 2)
        parts.append(f"## The notebook\n\n`chapters/{ch.name}/notebook.py`, executed when this "
                     "page was built.\n\n" + notebooks.to_markdown(nb, page_dir))
    (page_dir / "index.md").write_text("\n\n".join(parts))
    return fatal


def module_name(path: Path) -> str:
    """nanoserve/bench/serve.py -> "bench.serve"; a subpackage's __init__.py -> "bench"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """nanoserve's public modules and their files, found on disk so that a new file gets its
    page by itself (the package's own __init__ has none: the home page is its page)."""
    found = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        name = module_name(f)
        if name and not any(p.startswith("_") for p in name.split(".")):
            found[name] = f
    return found


def write_api() -> list[dict]:
    rows = ["# API reference", "",
            "Generated from the docstrings of the `nanoserve` package, one page per module.", "",
            "| module | what it holds |", "|---|---|"]
    nav = [{"Overview": "api/index.md"}]
    (DOCS / "api").mkdir(parents=True, exist_ok=True)
    for mod, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = doc.strip().splitlines()[0] if doc.strip() else ""
        (DOCS / "api" / f"{mod}.md").write_text(f"# nanoserve.{mod}\n\n::: nanoserve.{mod}\n")
        rows.append(f"| [`nanoserve.{mod}`]({mod}.md) | {cell(summary)} |")
        nav.append({f"nanoserve.{mod}": f"api/{mod}.md"})
    (DOCS / "api" / "index.md").write_text("\n".join(rows) + "\n")
    return nav


def write_home(chapters: list[Chapter]) -> None:
    lines = ["## Contents", ""]
    for _, _, phase in PHASES:
        members = [c for c in chapters if c.phase == phase]
        if members:
            lines += [f"### {phase}", ""] + [f"- [{c.title}]({c.page})" for c in members] + [""]
    home = (SITE / "home.md").read_text().replace("<!-- contents -->", "\n".join(lines))
    (DOCS / "index.md").write_text(home)


def input_files() -> list[str]:
    """Every file the book may be built from: what git tracks or would track (so build/,
    .venv/ and anything else ignored are out), relative to the root. Without git, the tree
    less those folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
        return sorted({f for f in out.split("\0") if f})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in {".git", "build", ".venv", "__pycache__"}]
            files += [str((Path(folder) / n).relative_to(ROOT)) for n in names]
        return sorted(files)


def inputs_state() -> dict:
    """The inputs as they stand: one hash over every input file's name and content (a file
    edited, added or removed changes it; a file merely touched does not), and the versions of
    Python and of the tools that run the book."""
    digest = hashlib.sha256()
    files = input_files()
    for name in files:
        path = ROOT / name
        digest.update(name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file()
                      else b"(absent)")
    tools = {}
    for name in TOOLS:
        try:
            tools[name] = version(name)
        except PackageNotFoundError:
            tools[name] = None
    return {"files": len(files), "sha256": digest.hexdigest(),
            "python": sys.version.split()[0], "tools": tools}


def freshness() -> tuple[bool, str]:
    """(is build/site current?, why): current when the stamp's inputs are today's inputs."""
    stamp = STAMP
    if not stamp.is_file():
        return False, f"no {stamp.relative_to(ROOT)}: the book has not been built here"
    missing = [p for p in (BUILD / "site" / "index.html", BUILD / "book.json") if not p.is_file()]
    if missing:
        return False, f"{missing[0].relative_to(ROOT)} is missing"
    try:
        recorded = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False, f"{stamp.relative_to(ROOT)} is not JSON"
    now, then = inputs_state(), recorded.get("inputs", {})
    if now == then:
        return True, (f"build/site is fresh: built {recorded.get('built', '?')} from these "
                      f"{now['files']} files (sha256 {now['sha256'][:12]})")
    changed = [k for k in ("sha256", "python", "tools") if now.get(k) != then.get(k)]
    what = {"sha256": "the files", "python": "Python", "tools": "the tools' versions"}
    return False, (f"{', '.join(what[k] for k in changed) or 'the stamp'} changed since "
                   f"build/site was built")


def write_stamp(state: dict, seconds: float) -> None:
    STAMP.write_text(json.dumps({"inputs": state, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "seconds": round(seconds)}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-mkdocs", action="store_true", help="only write build/docs/")
    ap.add_argument("--no-notebooks", action="store_true", help="skip executing notebooks")
    ap.add_argument("--fresh", action="store_true",
                    help="build nothing: exit 0 if build/site.stamp matches the inputs")
    args = ap.parse_args(argv)
    if args.fresh:
        fresh, why = freshness()
        print(f"site: {why}" + ("" if fresh else "; it needs a build"))
        return 0 if fresh else 1
    state = inputs_state()  # as the build starts: a file edited meanwhile makes it stale
    STAMP.unlink(missing_ok=True)
    sys.path.insert(0, str(ROOT))  # for chapters.runner and each chapter's claims
    start = time.perf_counter()
    shutil.rmtree(DOCS, ignore_errors=True)
    DOCS.mkdir(parents=True)
    chapters = find_chapters()
    book, failed = [], []
    for ch in chapters:
        t0 = time.perf_counter()
        figures = run_diagram(ch)
        failed += write_chapter(ch, figures, execute=not args.no_notebooks)
        book.append({"name": ch.name, "title": ch.title, "url": f"chapters/{ch.name}/",
                     "figures": referenced_figures(ch, figures)})
        print(f"  {ch.title}: {len(figures)} figure(s), {time.perf_counter() - t0:.1f}s")
    write_home(chapters)
    (DOCS / "assets").mkdir()
    shutil.copy2(SITE / "book.css", DOCS / "assets" / "book.css")
    nav = [{"Home": "index.md"}]
    for _, _, phase in PHASES:
        members = [{c.title: c.page} for c in chapters if c.phase == phase]
        if members:
            nav.append({phase: members})
    nav.append({"API reference": write_api()})
    (BUILD / "book.json").write_text(json.dumps({"nav": nav, "chapters": book}, indent=1))
    print(f"wrote {DOCS.relative_to(ROOT)}/: {len(chapters)} chapter(s)")
    if not args.no_mkdocs:
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                        str(SITE / "mkdocs.yml")], cwd=ROOT, check=True)
        print(f"built {(BUILD / 'site').relative_to(ROOT)}/")
    print(f"book built in {time.perf_counter() - start:.0f}s")
    if failed:
        print(f"book build failed: {len(failed)} claim(s) do not hold:", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return 1
    if not (args.no_mkdocs or args.no_notebooks):  # only a whole book counts as built
        write_stamp(state, time.perf_counter() - start)
        print(f"wrote {STAMP.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (notebooks.NotebookFailed, subprocess.CalledProcessError) as e:
        print(f"book build failed: {e}", file=sys.stderr)
        sys.exit(1)
