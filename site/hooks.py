"""mkdocs hook: take the nav from build/book.json, which build_book.py writes.

Why this exists: the nav depends on which chapters exist (grouped into parts, in day order) and on
which modules nanoserve/ holds, so it cannot be written by hand in mkdocs.yml. The generator knows
both; this hook hands its answer to mkdocs.
"""

from __future__ import annotations

import json
from pathlib import Path


def on_config(config):
    book = Path(config.docs_dir).parent / "book.json"
    if not book.is_file():
        raise SystemExit(f"{book} is missing: build with `make site` (site/build_book.py)")
    config.nav = json.loads(book.read_text())["nav"]
    return config
