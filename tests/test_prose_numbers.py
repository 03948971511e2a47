"""Every number in a chapter's prose is a claim's value, a declared input, or marked as quoted
(chapters/prose_numbers.py says how each is recognised). Reads files only: nothing is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from chapters.prose_numbers import check
from chapters.runner import all_chapters


@pytest.mark.parametrize("chapter", all_chapters(),
                         ids=lambda p: p.name)
def test_every_number_in_the_prose_is_accounted_for(chapter):
    findings = check(chapter)
    assert not findings, "\n".join(map(str, findings))


def _readme(tmp_path: Path, body: str, table: str = "| a count, pool 96 | 28 |") -> Path:
    ch = tmp_path / "day99_test"
    ch.mkdir()
    (ch / "README.md").write_text(f"# Day 99: Test\n\n{body}\n\n| claim | stated |\n|---|---|\n"
                                  f"{table}\n")
    return ch


@pytest.mark.parametrize("body", [
    "It took 28 iterations in a pool of 96 tokens.",            # a stated cell, a label
    "Inputs: 4 slots, block_size 4.\n\nFour slots: 4 of them.",  # declared inputs
    "The log says 48 (quoted from the lab log).",                # a quote marker
    "It held on an EPYC (quoted from results/x.json).",         # a machine, quoted
    "> the log: 48 iterations",                                  # a blockquote
    "Day 33 and Days 30-31, Week 8, `max_tokens=32`, bf16 and Llama-3.2-1B in torch 2.13.0.",
    "1. a list item\n2. another",                                # numbering
    "It costs T − 1 forwards and N(N − 1)/2 positions.",         # formula constants
    "| metric (quoted from results/x.json) | a |\n|---|---|\n| TTFT | 23.19 |",  # quoted table
    "    torchrun --master-port 29500",                          # an indented code block
    "Day 30's table says 45 (Day 30 names it).",                 # another day's claim, named
])
def test_accounted_numbers_pass(tmp_path, body):
    assert check(_readme(tmp_path, body)) == []


@pytest.mark.parametrize("body,what", [
    ("It took 29 iterations.", "29"),
    ("Speed-ups ran 0.86–1.19x.", "0.86"),
    ("It ran on an AMD EPYC.", "EPYC"),
    ("An H100 read 9,000 (quoted from the log). It took 29.", "29"),
    ("![a figure with C=16 columns](figures/x.png)", "16"),
    ("The grid is 8,192 / 4 = 2,048 wide.", "8,192"),
])
def test_unaccounted_numbers_and_machines_are_found(tmp_path, body, what):
    found = check(_readme(tmp_path, body))
    assert what in [f.what for f in found], found
