"""The shipped model's training is reproducible: same seed, same losses (slow: trains twice)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chapters.common import ROOT


@pytest.mark.slow
def test_training_is_reproducible(tmp_path):
    logs = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([sys.executable, "tools/train_tiny.py", "--out", str(out), "--steps", "6",
                        "--batch", "4", "--seq-len", "64"], cwd=ROOT, check=True,
                       capture_output=True)
        logs.append(json.loads((out / "train_log.json").read_text()))
    assert logs[0]["loss_every_50"] == logs[1]["loss_every_50"]
    assert logs[0]["val_loss"] == logs[1]["val_loss"]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == \
        (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model.safetensors").read_bytes()
