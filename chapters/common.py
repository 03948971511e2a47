"""Helpers the chapters' claims and notebooks share: reference checkpoints and the shipped model.

Why this module exists: several days check themselves against the same things (transformers'
Llama on a random checkpoint it wrote, the shipped nanoserve-tiny model, the Llama-3.2-1B shape),
and each should be made in one place. Checkpoints are written once per process into a temporary
folder. The Llama-3.2-1B shape (``nanoserve.bench.shapes``) and the machine's one-line
description (``hardware()``, ``nanoserve.bench.hardware``) are the package's own, named here so
that the chapters and the benchmarks cannot disagree about them.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

# Re-exported for the chapters: the package's own shape, and its one-line machine description.
from nanoserve.bench.hardware import describe_hardware as hardware  # noqa: F401
from nanoserve.bench.shapes import LLAMA_3_2_1B  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny"


@functools.cache
def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="nanoserve-chapters-"))


@functools.cache
def hf_checkpoint(name: str) -> Path:
    """A random Llama checkpoint written by transformers (see nanoserve.testing)."""
    from nanoserve.testing import write_hf_checkpoint

    return write_hf_checkpoint(_tmp() / name, name)


def reference_prompts(vocab: int = 256, n: int = 4) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, vocab - 1, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


# The log's static-batch shape (Days 29 and 30): eight requests, 5-token prompts, seven want 4
# tokens and one wants 32, block_size 4.
DAY29_PROMPTS = [[0, 10 + i, 20, 30, 40] for i in range(8)]
DAY29_MAX_TOKENS = [4, 4, 4, 4, 4, 4, 4, 32]


class one_thread:
    """Time with torch on one thread: on a small shared machine, two threads make every
    measurement hostage to whatever else runs. Restores the previous setting."""

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)


def best_of(rounds: int, runs: dict, wall) -> dict:
    """Run each named zero-argument callable ``rounds`` times, interleaved, on one thread; keep
    each one's result with the smallest ``wall(result)``, the least disturbed."""
    best: dict = {}
    with one_thread():
        for _ in range(rounds):
            for name, fn in runs.items():
                result = fn()
                if name not in best or wall(result) < wall(best[name]):
                    best[name] = result
    return best


def meta_model(config: dict, dtype=None):
    """The Day 1 snapshot's Llama built on the meta device in ``dtype``: every tensor has its
    real shape and dtype and no memory, so bytes are read from the tensors a structure
    allocates rather than computed from a config."""
    import torch

    from chapters.day01_llama_forward.snapshot.config import ModelConfig
    from chapters.day01_llama_forward.snapshot.model import Llama

    with torch.device("meta"):
        return Llama(ModelConfig.from_dict(config)).to(dtype or torch.float32)


def tensor_bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ForwardCounter:
    """Counts what goes through a model's forward, from outside it: calls, token positions
    (``input_ids.numel()``, padding included) and each call's (B, T). A forward pre-hook, so
    nothing in the snapshot or the package changes, and removed on exit.

    >>> with ForwardCounter(model) as fc:   # doctest: +SKIP
    ...     generate_cached(model, prompt, 8)
    >>> fc.calls, fc.positions              # doctest: +SKIP
    (8, 23)
    """

    def __init__(self, model):
        self.model = model
        self.calls = self.positions = 0
        self.shapes: list[tuple[int, ...]] = []

    def _hook(self, module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.calls += 1
        self.positions += ids.numel()
        self.shapes.append(tuple(ids.shape))

    def __enter__(self) -> ForwardCounter:
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
