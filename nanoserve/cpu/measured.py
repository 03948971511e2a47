"""Defaults chosen by measurement on this machine, and kept so that they stay the same.

Why this module exists: some choices have no right answer from CPU flags alone. Whether bf16
beats float32, or a hand-written small-M matmul beats oneDNN, differs between processors that
report the same flags (two machines with AVX512-BF16 and no AMX ran bf16 decode at 2x and at
0.83x float32). So the engine times the candidates once, on the shapes it will run, and writes
the verdict to a JSON file under ``build/``. The key names everything the verdict depends on
(the processor model, torch's version, the thread count, the shape), so the next load on the
same machine reads the same answer instead of re-measuring into a different one: defaults are
reproducible, and a new machine measures for itself.

    best = best_interleaved([fp32_call, bf16_call], reps=5)   # seconds, each arm's best
    verdict = cached("dtype_auto.json", key, lambda: {...})   # measured once per key
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nanoserve.cpu import csrc

DEFAULT_SHAPE = (576, 1536)  # SmolLM2-135M's MLP (hidden, intermediate): no model at hand


def cache_dir() -> Path:
    """Beside the C++ build: the repository's ``build/`` in a checkout."""
    return csrc.build_dir().parent


def machine_key() -> str:
    """What every timed verdict depends on, whatever it measured."""
    return f"{csrc.cpu_signature()}|torch {torch.__version__}|{torch.get_num_threads()} threads"


def best_interleaved(calls: list[Callable[[], object]], reps: int,
                     budget_s: float = math.inf) -> list[float]:
    """Each call's best time in seconds over ``reps`` rounds, the calls taking turns within a
    round, so that a burst of load on a shared machine hits every arm alike. Rounds stop early
    once ``budget_s`` seconds are spent, after at least two (a big model's shapes on a slow
    arm would otherwise hold up its load)."""
    best = [math.inf] * len(calls)
    start = time.perf_counter()
    for r in range(reps):
        for i, fn in enumerate(calls):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
        if r >= 1 and time.perf_counter() - start > budget_s:
            break
    return best


def cached(file: str, key: str, compute: Callable[[], dict], path: Path | None = None) -> dict:
    """The verdict stored under ``key`` in ``file``; ``compute()`` it and store it if absent."""
    path = path or cache_dir() / file
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(known)}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(path)  # atomic: a concurrent engine reads the old file or the new one
    return known[key]
