"""Shared pytest set-up: the gpu marker, the triton interpreter, reference checkpoints, and the
line that says how many timed chapter claims were left to the chapter targets."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # so `chapters` imports as a package

# Without CUDA, triton kernels run under the interpreter, and the test session chooses it here:
# nanoserve.cuda.kernels only checks (nanoserve.cuda.triton_mode). This must precede any triton
# import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Under pytest-xdist the cores are shared between the workers, not taken twice over.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))


_CHAPTER_CLAIMS_COLLECTED = False


def pytest_collection_modifyitems(config, items):
    global _CHAPTER_CLAIMS_COLLECTED
    _CHAPTER_CLAIMS_COLLECTED = any(item.path.name == "test_chapters.py" for item in items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say what the chapter checks left out: timed claims never run under pytest."""
    ran_chapters = _CHAPTER_CLAIMS_COLLECTED or any(  # under xdist, the workers collected
        getattr(r, "nodeid", "").startswith("tests/test_chapters.py")
        for reports in terminalreporter.stats.values() for r in reports)
    if not ran_chapters:
        return
    from chapters.runner import all_chapters, load_claims

    timed = [(ch.name, c.row) for ch in all_chapters() for c in load_claims(ch)
             if c.kind == "timed"]
    days = sorted({int(name[3:5]) for name, _ in timed})
    terminalreporter.write_line(
        f"chapters: {len(timed)} timed claim(s) not run here (days {', '.join(map(str, days))}); "
        "make chapter-N, make chapters, make site and make bench run them")


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """hf_checkpoint(name) -> folder written by transformers' save_pretrained (cached)."""
    from nanoserve.testing import write_hf_checkpoint

    cache: dict[tuple, Path] = {}

    def make(name: str = "gqa", **kw) -> Path:
        key = (name, repr(sorted(kw.items())))  # values may be lists
        if key not in cache:
            cache[key] = write_hf_checkpoint(tmp_path_factory.mktemp(name), name, **kw)
        return cache[key]

    return make
