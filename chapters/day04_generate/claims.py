"""Day 4's numbers: the generation loop against transformers, and the model the repo ships."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time

import torch

from chapters.common import ROOT, SHIPPED, hf_checkpoint, reference_prompts
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.runner import exact, timed

from .snapshot.generate import generate_uncached

PROMPT = "The while statement"  # what `make demo` sends
SAMPLE_PROMPT = 'The "while" statement is used'


def identical_to_transformers() -> int:
    """Greedy, 32 new tokens, 4 prompts on each of the 5 reference checkpoints."""
    from nanoserve.testing import CONFIGS, load_hf_model

    same = 0
    for name in CONFIGS:
        ours, ref = load_model(hf_checkpoint(name)), load_hf_model(hf_checkpoint(name))
        ref.generation_config.eos_token_id = None
        for prompt in reference_prompts():
            with torch.no_grad():
                expected = ref.generate(torch.tensor([prompt]), max_new_tokens=32,
                                        do_sample=False, pad_token_id=0)[0, len(prompt):]
            same += generate_uncached(ours, prompt, 32).token_ids == expected.tolist()
    return same


@functools.cache
def _tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))


def validation_loss() -> float:
    """Recomputed from the shipped weights on the held-out topics (every 10th, by name)."""
    from tools.train_tiny import corpus, encode_stream, evaluate

    _, val_docs = corpus()
    log = json.loads((SHIPPED / "train_log.json").read_text())
    return evaluate(load_model(SHIPPED), encode_stream(_tokenizer(), val_docs), log["seq_len"])


def final_training_loss() -> float:
    """Written by `make train-tiny` (mean of the last 50 steps); retraining reproduces it."""
    return json.loads((SHIPPED / "train_log.json").read_text())["final_train_loss"]


def train_log() -> dict:
    """What `make train-tiny` recorded about the run that made the shipped weights."""
    return json.loads((SHIPPED / "train_log.json").read_text())


def early_losses() -> str:
    """Training loss at step 1 and at step 50, as the training run logged them."""
    first, fiftieth = train_log()["loss_every_50"][:2]
    return f"{first:.2f}, {fiftieth:.2f}"


def training_run() -> str:
    """Tokens the run trained and validated on, and its wall time, from train_log.json."""
    log = train_log()
    return (f"{log['train_tokens']:,} / {log['val_tokens']:,} tokens; "
            f"{log['seconds'] / 60:.0f} minutes")


def memorisation() -> str:
    """Parameters per training token, and passes over the training text, from the same log."""
    log = train_log()
    seen = log["steps"] * log["batch"] * log["seq_len"]
    return (f"{log['parameters'] / log['train_tokens']:.1f} parameters per token; "
            f"{seen / log['train_tokens']:.1f} passes")


def greedy_sample(words: int = 8) -> str:
    tok = _tokenizer()
    ids = tok.encode(SAMPLE_PROMPT).ids
    gen = generate_uncached(load_model(SHIPPED), ids, 24, frozenset({1}))
    return " ".join(tok.decode(gen.token_ids).split()[:words])


def demo_seconds() -> float:
    """The `make demo` command itself, as a fresh process: imports, load, 60 tokens."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nanoserve.cli", "generate", PROMPT,
                    "--max-tokens", "60"], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


CLAIMS = [
    exact("greedy replies identical to transformers' `generate`", identical_to_transformers,
          fmt="{} of 20".format),
    exact("nanoserve-tiny vocabulary (byte-level BPE)", lambda: _tokenizer().get_vocab_size(),
          fmt="{:,}".format),
    exact("nanoserve-tiny final training loss", final_training_loss, fmt="{:.2f}".format),
    exact("nanoserve-tiny validation loss", validation_loss, fmt="{:.2f}".format),
    exact(f"greedy continuation of `{SAMPLE_PROMPT}`, first 8 words", greedy_sample),
    exact("nanoserve-tiny training loss at steps 1 and 50 (train_log.json)", early_losses),
    exact("the training run: training / validation tokens; wall time (train_log.json)",
          training_run),
    exact("parameters per training token; passes over the training text", memorisation),
    timed("`make demo` as a fresh process on a CPU", demo_seconds),
]
