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

# The book's parts, in order: (first day, last day, name, what the part builds). A chapter
# belongs to the part whose range holds its day; the home page and the nav list them in order.
PARTS = [
    (1, 13, "The model", "a Llama forward pass, generation, the KV cache and sampling"),
    (14, 26, "Memory", "the KV cache cut into blocks, as an operating system pages memory"),
    (27, 35, "Batching and scheduling",
     "many requests in one forward, the engine's loop, the floor a step cannot beat, preemption"),
    (36, 40, "Serving", "the engine core, the async front door and the OpenAI-compatible server"),
    (41, 45, "Chunked prefill and prefix caching",
     "a token budget per step, and prompts that share a prefix share its blocks"),
    (46, 48, "The server under fire", "bad input, overload, faults and a soak"),
    (49, 56, "Speed on a CPU", "compiled decode, bf16, the peers, fused C++ ops, the flags"),
    (57, 63, "Graphs and kernels", "CUDA graphs, the persistent batch and a Triton kernel"),
    (64, 68, "Scale and structure", "tensor parallelism and structured outputs"),
    (69, 71, "Many models",
     "model families beside Llama, sliding windows in a paged cache, parity without a hub"),
    (72, 75, "Fewer bytes",
     "quantized weights: what they cost in bytes and error, GPTQ, an int4 kernel, the speed"),
    (76, 78, "Guessing ahead",
     "speculative decoding: proposals verified k at a time, a rejection sampler that changes "
     "no distribution, n-gram against a draft model"),
    (79, 10**6, "Agents at the door",
     "tool calls forced by a grammar, and parsers for the calls and the thinking a model "
     "writes on its own"),
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
    def part(self) -> str:
        return next(p for lo, hi, p, _ in PARTS if lo <= self.day <= hi)


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


def numbers_table(ch: Chapter) -> tuple[str, list[str]]:
    """The chapter's one numbers table as the page shows it: each row of the README's table with
    what was measured when the page was built and the verdict, every kind measured (timed ones
    included); and the failures that must fail the build: any failing claim that is not timed.
    A failing timed claim is shown and warned about, never fatal: load on a shared machine is
    not a bug."""
    from chapters.runner import ChapterError, run_chapter

    try:
        results = run_chapter(ch.path)
    except ChapterError as e:
        return f"**error:** {cell(e)}\n", [f"{ch.title}: {e}"]
    rows = ["| claim | stated | measured | verdict |", "|---|---|---|---|"]
    fatal = []
    for r in (r for r in results if r.failed):
        line = f"{ch.title}: {r.claim.kind} claim {r.claim.row!r} {r.verdict}: {r.measured}"
        print(f"  {'error' if r.blocking else 'warning'}: {line}")
        if r.blocking:
            fatal.append(line)
    for r in results:
        kind = "" if r.claim.kind in ("exact", "bound") else f" ({r.claim.kind})"
        rows.append(f"| {cell(r.claim.row)} | {cell(r.stated)} | {cell(r.measured)} "
                    f"| {cell(r.verdict)}{kind} |")
    note = (f"*Measured when this page was built ({time.strftime('%Y-%m-%d')}, on "
            f"{cpu_name()}, torch {version('torch')}); `make chapter-{ch.day}` prints the same "
            "table on your machine. A timed row is a wall-clock ratio on that machine, shown but "
            "never failing the build; a gpu or recorded row is read from the measurement "
            "committed in the chapter's `results/` and names the machine that made it.*")
    return "\n".join(rows) + "\n\n" + note + "\n", fatal


def with_numbers(readme: str, table: str) -> str:
    """The README with its numbers table (the one headed ``| claim | stated |``) replaced by
    ``table``: one table per page, where the chapter put it."""
    from chapters.runner import _cells

    lines, out, i = readme.splitlines(), [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and _cells(lines[i])[:2] == ["claim", "stated"]:
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                i += 1
            out.append(table.rstrip("\n"))
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out) + "\n"


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
    """Write the chapter's page; return its failing claims (see numbers_table)."""
    page_dir = DOCS / "chapters" / ch.name
    (page_dir / "figures").mkdir(parents=True, exist_ok=True)
    for png in figures:
        shutil.copy2(png, page_dir / "figures" / png.name)
    source = ch.path / "notebook.py"
    shown = source.is_file() and execute
    readme = (ch.path / "README.md").read_text()
    fatal: list[str] = []
    if (ch.path / "claims.py").is_file():
        table, fatal = numbers_table(ch)
        readme = with_numbers(readme, table)
    parts = [rewrite_links(ch, readme, page_dir, shown).rstrip()]
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


def since_then_page(part: str, chapters: list[Chapter]) -> str | None:
    """The part's "Since then" page: each chapter's since_then.md (what later days changed about
    that day's work), under the chapter's title; None when no chapter of the part has one."""
    members = [c for c in chapters if c.part == part and (c.path / "since_then.md").is_file()]
    if not members:
        return None
    slug = re.sub(r"[^a-z0-9]+", "-", part.lower()).strip("-")
    page_dir = DOCS / "chapters" / f"since-{slug}"
    page_dir.mkdir(parents=True, exist_ok=True)
    text = [f"# {part}: since then", "",
            "What later days changed about this part's work, in the order of the chapters it "
            "changed. Each entry names the day that made the change; that day's chapter tells "
            "how, and its table holds the numbers.", ""]
    for c in members:
        body = rewrite_links(c, (c.path / "since_then.md").read_text(), page_dir, False)
        text += [f"## [{c.title}](../{c.name}/index.md)", "", body.strip(), ""]
    (page_dir / "index.md").write_text("\n".join(text))
    return f"chapters/since-{slug}/index.md"


def write_looking_back() -> str:
    """The closing chapter, chapters/looking_back/README.md, after the last part: not a day, so
    it has no claims of its own; its numbers are the days' it names."""
    page_dir = DOCS / "chapters" / "looking_back"
    page_dir.mkdir(parents=True, exist_ok=True)
    last = Chapter(ROOT / "chapters" / "looking_back", 10**6, "Looking back")
    text = (last.path / "README.md").read_text()
    (page_dir / "index.md").write_text(rewrite_links(last, text, page_dir, False))
    return "chapters/looking_back/index.md"


def write_home(chapters: list[Chapter], extra: dict[str, str | None]) -> None:
    """The home page: site/home.md with the parts and their chapters in place of its marker."""
    lines = []
    for n, (_, _, part, what) in enumerate(PARTS, 1):
        members = [c for c in chapters if c.part == part]
        if not members:
            continue
        lines += [f"### Part {n}: {part}", "", f"*{what[0].upper()}{what[1:]}.*", ""]
        lines += [f"- [{c.title}]({c.page})" for c in members]
        if extra.get(part):
            lines.append(f"- [Since then]({extra[part]})")
        lines.append("")
    lines += ["### Closing", "", f"- [Looking back]({extra['Looking back']})", ""]
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
    extra = {part: since_then_page(part, chapters) for _, _, part, _ in PARTS}
    extra["Looking back"] = write_looking_back()
    write_home(chapters, extra)
    (DOCS / "assets").mkdir()
    shutil.copy2(SITE / "book.css", DOCS / "assets" / "book.css")
    nav = [{"Home": "index.md"}]
    for n, (_, _, part, _) in enumerate(PARTS, 1):
        members = [{c.title: c.page} for c in chapters if c.part == part]
        if extra.get(part):
            members.append({"Since then": extra[part]})
        if members:
            nav.append({f"Part {n}: {part}": members})
    nav.append({"Looking back": extra["Looking back"]})
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
