"""``make gpu-check`` makes every single-card row of the book, and nothing passes one on a CPU.

Why this file exists: a card is lent for minutes, by chance, so the one script it runs
(``tools/gpu_check.py``) must already write every results file a ``gpu(...)`` claim reads, or
that row can never be measured. These tests hold the plan to the book: every gpu claim's
``results/<file>`` is written by some stage and every file a stage writes is read by a claim;
``--plan`` lists them; the docstring names the stages the code runs; without the files every
card row reads "skipped: needs a GPU" and rows that need two cards say so. The capture stage's
code (Day 57's ``bench.py``) runs here with eager replay, and a results file in its format is
read back by the runner, so only the recording itself is left to the card.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chapters import runner
from chapters.runner import all_chapters, bind, load_claims

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

NO_CARD = pytest.mark.skipif(torch.cuda.is_available(), reason="on a card the rows measure")


def gpu_claims() -> list[tuple[Path, runner.Claim]]:
    return [(ch, c) for ch in all_chapters() for c in load_claims(ch) if c.kind == "gpu"]


def test_the_book_has_card_rows_in_three_chapters():
    days = {ch.name[:5] for ch, _ in gpu_claims()}
    assert {"day57", "day59", "day62"} <= days


def test_every_gpu_claim_reads_a_file_some_stage_writes():
    written = {p: s.name for s in gpu_check.stages() for p in s.writes}
    missing = [f"{ch.name}: {c.row!r} reads results/{c.result_file}"
               for ch, c in gpu_claims() if ch / "results" / c.result_file not in written]
    assert not missing, "no stage of make gpu-check writes these:\n" + "\n".join(missing)


def test_every_file_a_stage_writes_is_read_by_a_claim():
    read = {ch / "results" / c.result_file for ch, c in gpu_claims()}
    for stage in gpu_check.stages():
        for path in stage.writes:
            assert path in read, f"stage {stage.name!r} writes {path}, which no claim reads"


def test_plan_lists_a_stage_for_every_card_row(tmp_path):
    r = subprocess.run([sys.executable, "tools/gpu_check.py", "--plan"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    names = re.findall(r"^\d+\. ([a-z ]+?)(?: \(at most [\d.]+ s\))?:", r.stdout, re.M)
    assert names == [s.name for s in gpu_check.stages()]
    listed = set(re.findall(r"^   writes (\S+)$", r.stdout, re.M))
    for ch, c in gpu_claims():
        assert str((ch / "results" / c.result_file).relative_to(ROOT)) in listed, c.row
    # --results sends every file to one folder instead
    r = subprocess.run([sys.executable, "tools/gpu_check.py", "--plan", "--results",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert sorted(re.findall(r"^   writes (\S+)$", r.stdout, re.M)) == sorted(
        str(tmp_path / name) for name in gpu_check.results_paths())


def test_the_docstring_lists_the_stages_the_code_runs():
    doc = gpu_check.__doc__
    listed = re.findall(r"^(\d+)\. ([a-z ]+):", doc, re.M)
    stages = [s.name for s in gpu_check.stages()]
    assert [name for _, name in listed] == stages
    assert [int(i) for i, _ in listed] == list(range(1, len(stages) + 1))
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"in {words[len(stages)]} stages" in doc


def test_stages_before_the_arms_leave_them_their_reserve():
    import time

    deadline = time.perf_counter() + gpu_check.BUDGET_S
    spent = 0.0
    for name in ("gpu tests", "capture", "kernel"):  # the worst case: each runs to its limit
        limit = gpu_check.time_left(name, deadline - spent)
        assert limit <= gpu_check.CEILING_S[name]
        spent += limit
    assert gpu_check.BUDGET_S - spent >= gpu_check.ARMS_RESERVE_S - 10.0 * 3


@NO_CARD
def test_card_rows_read_skipped_without_a_results_file():
    for ch, c in gpu_claims():
        if (ch / "results" / c.result_file).exists():
            continue
        stated = dict((cl.row, st) for cl, st in bind(ch))[c.row]
        assert runner.evaluate(c, stated, ch).verdict == "skipped: needs a GPU", c.row


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2,
                    reason="two cards here: the rows run")
def test_rows_that_need_two_cards_say_so_and_are_not_gpu_claims():
    found = []
    for ch in all_chapters():
        for c in load_claims(ch):
            why = c.needs() if c.needs is not None else None
            if why and "GPUs" in why:
                found.append(c.row)
                assert why.startswith("needs 2 GPUs"), why
                assert c.kind != "gpu", f"{c.row}: gpu-check runs on one card"
    assert found, "Day 66's NCCL row needs two cards"


def test_results_come_back_under_their_path_in_the_repository(tmp_path, monkeypatch):
    root, out = tmp_path / "repo", tmp_path / "out"
    out.mkdir()
    made = root / "chapters" / "day57_graph_capture" / "results" / "capture.json"
    made.parent.mkdir(parents=True)
    made.write_text("{}")
    monkeypatch.setattr(gpu_check, "ROOT", root)
    monkeypatch.setenv("OUT", str(out))
    gpu_check.copy_out(made)
    assert (out / "chapters" / "day57_graph_capture" / "results" / "capture.json").is_file()


def test_weights_stage_parameter_count_is_what_it_writes(tmp_path):
    from nanoserve.bench.shapes import SHAPES

    cfg = dict(SHAPES["llama-3.2-1b"], vocab_size=256, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    info = gpu_check.write_weights(tmp_path, cfg=cfg, device="cpu")
    assert info["parameters"] == sum(math.prod(s) for s in gpu_check.weight_shapes(cfg).values())


def test_capture_stage_runs_here_without_the_recording(tmp_path):
    """Day 57's capture stage on this CPU: the same two engines with eager replay. Then a
    results file in the stage's format (the card's capture list in place of the empty one a
    CPU records) is read back by the runner, and every Day 57 card row passes from it."""
    from chapters.day57_graph_capture import bench

    values = bench.capture_run("cuda" if torch.cuda.is_available() else "cpu")
    assert values["differ"] == 0 and values["share"] == 1.0
    assert values["replayed"] == values["decode_steps"] > 0
    assert values["addresses"] == {"same": 7, "held": 7}
    assert values["sizes"] == [1, 2, 4, 8]
    if not torch.cuda.is_available():
        assert values["mode"] == "eager replay" and values["captured"] == []
        assert bench.main(["--out", str(tmp_path / "x.json")]) == 1  # no card, no file
        assert not (tmp_path / "x.json").exists()
    head = {"device": "Test Card 80GB", "torch": torch.__version__, "cuda": "12.8",
            "date": "2026-01-02", "command": bench.COMMAND}
    chapter = tmp_path / "day57_graph_capture"
    (chapter / "results").mkdir(parents=True)
    data = bench.results(values | {"captured": values["sizes"]}, head)
    (chapter / "results" / "capture.json").write_text(json.dumps(data))
    ch57 = ROOT / "chapters" / "day57_graph_capture"
    card_rows = [(c, stated) for c, stated in bind(ch57) if c.kind == "gpu"]
    assert len(card_rows) == 4
    for c, stated in card_rows:
        if torch.cuda.is_available():
            continue  # a card measures these rows directly instead
        verdict = runner.evaluate(c, stated, chapter).verdict
        assert verdict == "pass from results (Test Card 80GB, 2026-01-02)", (c.row, verdict)
