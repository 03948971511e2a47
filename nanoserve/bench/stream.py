"""What a decode step's weight stream costs: the small-M kernel's arithmetic and its memory apart.

Why this module exists: an 8-row decode step through ``csrc/small_gemm.cpp`` both reads every
weight once and does 8 multiply-adds per weight element, and which of the two it waits on decides
what can make it faster. This command times the kernel over a whole step's packed weights (the
30 layers' four linears and the LM head of SmolLM2-135M's shape, random, on 2 MiB pages as the
engine places them) at 1 row, where memory is all there is, and at 8 rows; and at 8 rows over one
weight that stays in the last-level cache, walked again and again for the same multiply-adds,
where the arithmetic is all there is (one big weight rather than a tiny one, so that the op's
per-call cost stays what it is in a step: tens of calls, not thousands). If the 8-row step
overlapped the two it would take about the larger of the other two times; if it takes their
sum, it does not.

    python -m nanoserve.bench.stream --dtype float32 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nanoserve.bench.speedpaths import SMOLLM2_135M

IN_CACHE = (3072, 576)  # float32: 7 MB, inside an EPYC's 32 MB L3; 76 calls make a step


def step_weights(dtype: torch.dtype) -> list[tuple[torch.Tensor, int]]:
    """(packed weight, out_features) for one decode step's linears, SmolLM2-135M's shape."""
    E, F, L = (SMOLLM2_135M[k] for k in ("hidden_size", "intermediate_size",
                                          "num_hidden_layers"))
    D = E // SMOLLM2_135M["num_attention_heads"]
    qkv = (SMOLLM2_135M["num_attention_heads"] + 2 * SMOLLM2_135M["num_key_value_heads"]) * D
    shapes = [(qkv, E), (E, E), (2 * F, E), (E, F)] * L + [(SMOLLM2_135M["vocab_size"], E)]
    g = torch.Generator().manual_seed(0)
    return [(torch.ops.nanoserve.pack_small_gemm((torch.randn(n, k, generator=g) * 0.02)
                                                 .to(dtype)), n) for n, k in shapes]


def timed_pass(weights: list[tuple[torch.Tensor, int]], rows: int, dtype: torch.dtype,
               reps: int) -> float:
    """The median seconds of ``reps`` passes of the kernel over every weight at ``rows`` rows."""
    xs = {}
    for w, _ in weights:
        k = w.shape[1] * (2 if w.dim() == 4 else 1)  # bf16 packs k in pairs
        xs.setdefault(k, torch.randn(rows, k).to(dtype))
    outs = [torch.empty(rows, n, dtype=dtype) for _, n in weights]
    times = []
    for _ in range(reps + 1):  # the first pass is a warm-up
        t = time.perf_counter()
        for (w, _), out in zip(weights, outs, strict=True):
            k = w.shape[1] * (2 if w.dim() == 4 else 1)
            torch.ops.nanoserve.small_gemm(out, xs[k], w, None)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def main(argv=None) -> None:
    from nanoserve.cpu import csrc
    from nanoserve.cpu.huge_pages import place
    from nanoserve.cpu.small_gemm import unavailable

    p = argparse.ArgumentParser(prog="python -m nanoserve.bench.stream")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=9)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    if why := csrc.load() or unavailable(dtype):
        raise SystemExit(f"no small-M kernel here: {why}")
    weights = step_weights(dtype)
    views, note = place([w for w, _ in weights])
    weights = [(v, n) for v, (_, n) in zip(views, weights, strict=True)]
    nbytes = sum(w.numel() * w.element_size() for w, _ in weights)
    elements = sum(w.numel() for w, _ in weights)
    n, k = IN_CACHE
    small = torch.ops.nanoserve.pack_small_gemm(torch.randn(n, k).to(dtype))
    in_cache = [(small, n)] * (elements // small.numel())  # the same multiply-adds
    print(f"{a.dtype}, torch {torch.get_num_threads()} thread(s), one step's weights "
          f"{nbytes / 1e6:.0f} MB ({note}); median of {a.reps} passes")
    for label, ws, rows in (("1 row, from memory", weights, 1),
                            ("8 rows, from memory", weights, 8),
                            (f"8 rows, one {n}x{k} weight in cache", in_cache, 8)):
        t = timed_pass(ws, rows, dtype, a.reps)
        print(f"  {label:<38} {t * 1e3:7.1f} ms  {2 * rows * elements / t / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
