"""Which matmul a decode-sized bf16 linear runs: oneDNN's packed one, or the small-M kernel.

Why this module exists: a linear at decode size streams its weight once per step, and how fast it
streams depends on the kernel and on the processor. ``csrc/small_gemm.cpp`` streams a repacked bf16
weight with AVX512-BF16 dot products; oneDNN blocks for larger batches, and on a CPU with AMX its
tile kernels win as soon as a few rows share the weight. Neither is faster everywhere, so neither
is chosen from CPU flags: at load, each distinct weight shape is timed both ways at 1, 2, 4 and 8
rows, and the small kernel takes the row counts up to the first where it does not win by ``MARGIN``
(``small_rows``; 0 keeps oneDNN alone and the repacked copy is never made). The choice is cached
per CPU model, torch version, thread count and shape in ``build/small_gemm.json``, so an engine's
defaults are the same from one run to the next.

    rows = choose(N, K)  # 0: oneDNN only; r: batches of at most r rows take the small kernel
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import csrc
from .measured import best_interleaved, cache_dir, cached, machine_key

ROWS = (1, 2, 4, 8)
REPS = 7
MARGIN = 1.1  # the small kernel must win by 10%: a near-tie is noise, and oneDNN is the default


def cache_path() -> Path:
    return cache_dir() / "small_gemm.json"


def unavailable() -> str | None:
    """Why the small kernel cannot run here, or None."""
    why = csrc.load()
    if why:
        return why
    if not torch.ops.nanoserve.small_gemm_available():
        return "the C++ ops were built without AVX512-BF16 (no dpbf16 on this CPU)"
    return None


def measure(N: int, K: int) -> dict[int, float]:
    """oneDNN time / small-kernel time at each row count, on random weights of this shape: the
    two timed in alternation, each its best of ``REPS``."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g).bfloat16()
    dnn = torch.ops.mkldnn._reorder_linear_weight(w, 8)
    small = torch.ops.nanoserve.pack_small_gemm(w)
    ratios = {}
    for m in ROWS:
        x = torch.randn(m, K, generator=g).bfloat16()
        out = torch.empty(m, N, dtype=torch.bfloat16)
        best = best_interleaved(
            [lambda x=x, out=out: torch.ops.nanoserve.small_gemm(out, x, small, None),
             lambda x=x: torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], "")], REPS)
        ratios[m] = best[1] / best[0]
    return ratios


def choose(N: int, K: int) -> int:
    """The largest row count up to which the small kernel won every measured count (0: none)."""
    if K % 2 or unavailable():
        return 0
    key = f"{machine_key()}|{N}x{K}|margin {MARGIN}"

    def verdict() -> dict:
        ratios = measure(N, K)
        rows = 0
        for m in ROWS:
            if ratios[m] < MARGIN:
                break
            rows = m
        return {"rows": rows, "onednn_over_small": {str(m): round(r, 3)
                                                    for m, r in ratios.items()}}
    return int(cached("small_gemm.json", key, verdict, cache_path())["rows"])
