"""The claims runner: every chapter's numbers, recomputed and held against the prose.

Why this module exists: a book about performance rots the moment a number in the prose stops being
the number the code produces. Each chapter lists its numbers in ``claims.py`` as ``Claim`` objects:
the value exactly as README.md states it, a function that recomputes it, and the rule that decides
whether the measurement supports the statement. ``make chapter-N`` runs them and prints a table;
``tests/test_chapters.py`` runs them in CI and checks that every stated value appears, verbatim,
in the chapter's README.md.

A claim that needs a GPU is *skipped* on a machine without CUDA, never passed. When the chapter
has committed GPU measurements (``results/*.json``) the claim reads them instead, and the verdict
says which hardware produced them.

    python -m chapters.runner 7          # one chapter
    python -m chapters.runner all        # every chapter
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAPTERS = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Claim:
    """One number the chapter states.

    ``stated`` is the text as it appears in README.md. ``measure`` recomputes the value.
    ``holds(measured)`` decides the verdict; by default the measured value, formatted with
    ``fmt``, must equal ``stated`` exactly. ``show`` formats the measurement for the table.
    """

    name: str
    stated: str
    measure: Callable[[], Any]
    holds: Callable[[Any], bool] | None = None
    fmt: Callable[[Any], str] = str
    needs_gpu: bool = False
    result_file: str | None = None  # results/<file>.json holding the GPU measurement

    def check(self, measured: Any) -> bool:
        if self.holds is not None:
            return bool(self.holds(measured))
        return self.fmt(measured) == self.stated


def exact(name: str, stated: str, measure: Callable[[], Any],
          fmt: Callable[[Any], str] = str) -> Claim:
    """The recomputed value, formatted with ``fmt``, must read exactly ``stated``."""
    return Claim(name, stated, measure, fmt=fmt)


def at_most(name: str, stated: str, bound: float, measure: Callable[[], float],
            fmt: Callable[[Any], str] = "{:.2e}".format) -> Claim:
    """An upper bound, for quantities that move from run to run (errors, times)."""
    return Claim(name, stated, measure, holds=lambda m: m <= bound, fmt=fmt)


def at_least(name: str, stated: str, bound: float, measure: Callable[[], float],
             fmt: Callable[[Any], str] = "{:.2f}".format) -> Claim:
    """A lower bound, for speed-ups measured on whatever CPU runs the check."""
    return Claim(name, stated, measure, holds=lambda m: m >= bound, fmt=fmt)


@dataclass(frozen=True, slots=True)
class Result:
    claim: Claim
    measured: str
    verdict: str  # "pass", "FAIL", "skipped: ..." or "pass (<hardware>)"

    @property
    def failed(self) -> bool:
        return self.verdict == "FAIL" or self.verdict.startswith("error")


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


def _gpu_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def evaluate(claim: Claim, chapter: Path) -> Result:
    if claim.needs_gpu and not _gpu_available():
        path = chapter / "results" / (claim.result_file or "")
        if claim.result_file and path.is_file():
            data = json.loads(path.read_text())
            value = data["value"]
            hw = data.get("hardware", "unknown hardware")
            ok = claim.check(value)
            return Result(claim, claim.fmt(value), f"pass ({hw})" if ok else "FAIL")
        return Result(claim, "-", "skipped: needs a GPU")
    try:
        measured = claim.measure()
    except Exception as e:  # a claim that cannot be computed is a failure, shown as such
        return Result(claim, f"{type(e).__name__}: {e}", "error")
    return Result(claim, claim.fmt(measured), "pass" if claim.check(measured) else "FAIL")


def run_chapter(chapter: Path) -> list[Result]:
    return [evaluate(c, chapter) for c in load_claims(chapter)]


def print_table(chapter: Path, results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (chapter / "README.md").read_text().splitlines()[0].lstrip("# ")
    table = Table(title=title, show_lines=False)
    for col in ("claim", "stated", "measured", "verdict"):
        table.add_column(col, overflow="fold")
    styles = {"pass": "green", "FAIL": "bold red", "error": "bold red"}
    for r in results:
        style = next((s for k, s in styles.items() if r.verdict.startswith(k)), "yellow")
        table.add_row(r.claim.name, r.claim.stated, r.measured, f"[{style}]{r.verdict}[/]")
    Console(width=140).print(table)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m chapters.runner DAY|all", file=sys.stderr)
        return 2
    chapters = all_chapters() if argv[0] == "all" else [chapter_dir(argv[0])]
    failed = 0
    for ch in chapters:
        results = run_chapter(ch)
        print_table(ch, results)
        failed += sum(r.failed for r in results)
    if failed:
        print(f"{failed} claim(s) did not hold", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
