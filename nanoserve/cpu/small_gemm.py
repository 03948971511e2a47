"""Which matmul a decode-sized linear runs: the small-M kernel, or the one it would run anyway.

Why this module exists: a linear at decode size streams its weight once per step, and how fast it
streams depends on the kernel and on the processor. ``csrc/small_gemm.cpp`` streams a repacked
weight: bf16 with AVX512-BF16 dot products, float32 with AVX-512 multiply-adds, and both with
AVX2 multiply-adds on a CPU without AVX-512 (``csrc/small_gemm_avx2.h``, bf16 widened exactly in
registers). oneDNN blocks for larger batches, and on a CPU with AMX its tile kernels win as soon
as a few rows share the weight. Neither is faster everywhere, so neither is chosen from CPU
flags: at load, each distinct weight shape and dtype is timed both ways at 1, 2, 4 and 8 rows,
and the small kernel takes the row counts up to the largest where it wins by ``MARGIN``, unless
it clearly loses (by the same factor) at a smaller one (``small_rows``; 0 keeps the other linear
alone and the repacked copy is never made). A tie between two wins does not stop it: float32
weights of SmolLM2-135M's MLP timed 1.3x, 1.2x, 1.0x, 1.3x at 1, 2, 4 and 8 rows, and stopping
at the tie kept 8-row decode steps on oneDNN, 13% slower end to end.

The other linear is oneDNN's packed one where ``prepack`` packed the weights, and ``F.linear``
where it did not (``against``): on an AVX2-only CPU oneDNN has no bf16 kernel at all, and a bf16
``F.linear`` there is ATen's own loop. Past 8 rows the kernel runs 8 at a time, so its cost per
row stays flat while a blocked GEMM's falls as rows grow: a kernel that wins at 8 rows is also
timed at 64 and, winning there, at 512; it takes batches up to the largest of those it won, or
every batch, prefills included, if it won at 512 (``ALL_ROWS``). On an AVX2 EPYC, one thread,
float32 against MKL's ``F.linear``, SmolLM2-135M's 3072 x 576 weight ran 1.16x as fast through
the kernel at 64 rows and 0.88x at 512 (0.85x at 2,048), while bf16 against ATen's loop won
about 6x at all three. The choice is cached per CPU, torch version, thread count, shape, dtype, the
other linear and build of the kernels in ``build/small_gemm.json``, so an engine's defaults are
the same from one run to the next.

The float32 kernel sums in another order than oneDNN or ``F.linear``, as the packed linear's
already do, so float32 results match the reference to rounding, not to the bit.

    rows = choose(N, K)                            # bf16 vs oneDNN; 0: none; r: <= r rows
    rows = choose(N, K, torch.float32, "linear")   # a float32 weight against F.linear
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from nanoserve.cpu import csrc
from nanoserve.cpu.measured import best_interleaved, cache_dir, cached, machine_key

ROWS = (1, 2, 4, 8)
PREFILL_ROWS = (64, 512)  # a prompt chunk beside decodes, and a long one
ALL_ROWS = 1 << 30  # the verdict "every batch", prefill included
REPS = 7
PREFILL_BUDGET_S = 1.0  # per prefill probe: two rounds at least, more if they are quick
MARGIN = 1.1  # the small kernel must win by 10%: a near-tie is noise, and oneDNN is the default
AGAINST = ("onednn", "linear")  # oneDNN's packed linear, or F.linear on the weight as loaded


def cache_path() -> Path:
    return cache_dir() / "small_gemm.json"


def unavailable(dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why the small kernel cannot run here for weights of ``dtype``, or None."""
    why = csrc.load()
    if why:
        return why
    if dtype == torch.float32:
        if not torch.ops.nanoserve.small_gemm_f32_available():
            return "the C++ ops were built without AVX-512F or AVX2 with FMA"
        return None
    if dtype != torch.bfloat16:
        return f"no small-M kernel for {dtype}"
    if not torch.ops.nanoserve.small_gemm_available():
        return "the C++ ops were built without AVX512-BF16 or AVX2 with FMA"
    return None


def measure(N: int, K: int, dtype: torch.dtype = torch.bfloat16, against: str = "onednn",
            rows: tuple[int, ...] = ROWS, budget_s: float = math.inf) -> dict[int, float]:
    """The other linear's time / small-kernel time at each row count, on random weights of this
    shape: the two timed in alternation, each its best of ``REPS``."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g).to(dtype)
    if against == "onednn":
        dnn = torch.ops.mkldnn._reorder_linear_weight(w, 8)

        def other(x):
            return torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], "")
    else:
        def other(x):
            return F.linear(x, w)
    small = torch.ops.nanoserve.pack_small_gemm(w)
    ratios = {}
    for m in rows:
        x = torch.randn(m, K, generator=g).to(dtype)
        out = torch.empty(m, N, dtype=dtype)
        best = best_interleaved(
            [lambda x=x, out=out: torch.ops.nanoserve.small_gemm(out, x, small, None),
             lambda x=x: other(x)], REPS, budget_s)
        ratios[m] = best[1] / best[0]
    return ratios


def choose(N: int, K: int, dtype: torch.dtype = torch.bfloat16, against: str = "onednn") -> int:
    """The largest row count the small kernel takes (0: none; ``ALL_ROWS``: every batch), by
    the rule above, against ``against``: the linear the engine would run otherwise."""
    if against not in AGAINST:
        raise ValueError(f"against={against!r}; choose one of {AGAINST}")
    if against == "onednn":
        from nanoserve.cpu.onednn import unavailable as onednn_unavailable

        if why := onednn_unavailable(torch.device("cpu"), dtype):
            raise ValueError(f"against='onednn': {why}")
    if (dtype == torch.bfloat16 and K % 2) or unavailable(dtype):
        return 0
    # the build's key too: a kernel edited is a kernel to time again
    key = (f"{machine_key()}|{N}x{K}|margin {MARGIN}|{str(dtype).removeprefix('torch.')}"
           f"|vs {against}|prefill {','.join(map(str, PREFILL_ROWS))}|ops {csrc.build_key()}")

    def verdict() -> dict:
        ratios = measure(N, K, dtype, against)
        rows = 0
        for m in ROWS:
            if ratios[m] < 1 / MARGIN:  # a clear loss: no larger batch takes the kernel
                break
            if ratios[m] >= MARGIN:  # a clear win; a tie in between neither wins nor blocks
                rows = m
        for m in PREFILL_ROWS if rows == ROWS[-1] else ():  # a win at 8: prefills too?
            ratios |= measure(N, K, dtype, against, (m,), PREFILL_BUDGET_S)
            if ratios[m] < MARGIN:
                break
            rows = ALL_ROWS if m == PREFILL_ROWS[-1] else m
        return {"rows": rows, f"{against}_over_small": {str(m): round(r, 3)
                                                        for m, r in ratios.items()}}
    return int(cached("small_gemm.json", key, verdict, cache_path())["rows"])
