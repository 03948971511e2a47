"""What ``dtype="auto"`` picks on a CPU: the dtype whose linears this processor runs faster.

Why this module exists: Day 52 read the answer off the CPU's flags (bf16 wherever AMX or
AVX512-BF16 is listed), and the flags turned out not to decide it. Two 2-core machines with
AVX512-BF16 and no AMX ran bf16 decode at 2x and at 0.83x float32, and a bf16 GEMM at 512 rows
ran at 81 GFLOP/s on the second against float32's 149. So at load the model's own MLP shapes are
timed in both dtypes, the way the engine would run them (bf16 through oneDNN's packed linear
where it is available, float32 through ``F.linear``, and either through the small-M kernel where
the C++ ops have it for that dtype, the faster of the two counting, since ``small_gemm.choose``
keeps the faster), at a small and a full decode batch (``ROWS``), the arms interleaved. The
kernel matters here: on an AVX2-only EPYC, where oneDNN has no bf16 kernel, bf16 through
``F.linear`` timed a sixth to a quarter of float32's speed, and through the kernel the engine
ran bf16 faster than float32 end to end. bfloat16 is chosen only if it is at least ``MARGIN``
faster over the two batches (the geometric mean of the two time ratios): it costs accuracy, so a
tie goes to float32. The verdict is cached per CPU model, torch version, thread count and shape
in ``build/dtype_auto.json`` (``measured.cached``), so the same machine always gives the same
default, and ``llm.dtype_reason`` quotes the measured ratio. An engine that will not run an
arm does not time it: ``kernels=False`` or ``prepack=False`` leaves the small-M kernel out, and
``prepack=False`` oneDNN's packed bf16 linear too (``kernel``, ``onednn``; both in the key).

    dtype, why = choose(hidden_size=576, intermediate_size=1536)
    dtype, why = choose(576, 1536, kernel=False)   # an engine with kernels=False
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from nanoserve.cpu.measured import best_interleaved, cache_dir, cached, machine_key

ROWS = (8, 64)  # a small decode batch and a full one
REPS = 5
BUDGET_S = 1.0  # per batch size: fewer rounds on a big model, never fewer than two
MARGIN = 1.1  # bf16 must be 10% faster: it costs accuracy, and a near-tie is noise


def cache_path() -> Path:
    return cache_dir() / "dtype_auto.json"


def _bf16_linear(w: torch.Tensor, onednn: bool = True):
    """The bf16 linear the engine would run: packed for oneDNN where it can be (and
    ``onednn``), else plain."""
    from nanoserve.cpu.onednn import unavailable

    if onednn and unavailable(torch.device("cpu"), torch.bfloat16) is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, ROWS[0])
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return lambda x: F.linear(x, w)


def _small_linear(w: torch.Tensor):
    """The small-M kernel on ``w`` where the C++ ops have it for ``w``'s dtype, else None."""
    from nanoserve.cpu.small_gemm import unavailable

    if unavailable(w.dtype) or (w.dtype == torch.bfloat16 and w.shape[1] % 2):
        return None
    packed = torch.ops.nanoserve.pack_small_gemm(w)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(x.shape[0], w.shape[0])
        torch.ops.nanoserve.small_gemm(out, x, packed, None)
        return out
    return run


def kernel_key(kernel: bool = True, onednn: bool = True) -> str:
    """What the measurement depends on besides the machine: which C++ build, if any, it timed,
    and whether oneDNN's packed linear was an arm."""
    from nanoserve.cpu import csrc
    from nanoserve.cpu.small_gemm import unavailable

    key = ("no small-M kernel" if not kernel or unavailable(torch.float32)
           else f"ops {csrc.build_key()}")
    return key if onednn else f"{key}|no oneDNN packing"


@torch.inference_mode()
def measure(hidden: int, intermediate: int, kernel: bool = True,
            onednn: bool = True) -> dict[int, float]:
    """float32 time / bf16 time at each row count, over the up (gate and up fused) and the
    down projection of one MLP, on random weights of the model's shape; each dtype's time is
    its faster linear (``_bf16_linear`` or ``F.linear``, or the small-M kernel where ``kernel``)."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2 * intermediate, hidden), (hidden, intermediate))  # (N, K) each
    weights = [torch.randn(n, k, generator=g) * k ** -0.5 for n, k in shapes]
    linears = {torch.float32: [[lambda x, w=w: F.linear(x, w) for w in weights]],
               torch.bfloat16: [[_bf16_linear(w.bfloat16(), onednn) for w in weights]]}
    for dtype, arms in linears.items():
        small = [_small_linear(w.to(dtype)) for w in weights] if kernel else []
        if small and all(small):
            arms.append(small)
    ratios = {}
    for m in ROWS:
        xs = [torch.randn(m, k, generator=g) for _, k in shapes]
        calls, owner = [], []
        for dtype, arms in linears.items():
            xd = [x.to(dtype) for x in xs]
            for fs in arms:
                calls.append(lambda xd=xd, fs=fs: [f(x) for x, f in zip(xd, fs, strict=True)])
                owner.append(dtype)
        best = best_interleaved(calls, REPS, BUDGET_S)
        fp32_t, bf16_t = (min(t for t, d in zip(best, owner, strict=True) if d == dtype)
                          for dtype in (torch.float32, torch.bfloat16))
        ratios[m] = fp32_t / bf16_t
    return ratios


def choose(hidden: int, intermediate: int, kernel: bool = True,
           onednn: bool = True) -> tuple[torch.dtype, str]:
    """(dtype, why) for ``dtype="auto"`` on this CPU and a model of this MLP shape, timing
    only the linears an engine with these settings runs (``kernel``: the small-M kernel may
    run; ``onednn``: bf16 may be packed for oneDNN)."""
    key = (f"{machine_key()}|{hidden}x{intermediate}|margin {MARGIN}|"
           f"{kernel_key(kernel, onednn)}")

    def verdict() -> dict:
        ratios = measure(hidden, intermediate, kernel, onednn)
        gain = math.prod(ratios.values()) ** (1 / len(ratios))
        return {"dtype": "bfloat16" if gain >= MARGIN else "float32", "gain": round(gain, 3),
                "fp32_over_bf16": {str(m): round(r, 3) for m, r in ratios.items()}}
    v = cached("dtype_auto.json", key, verdict, cache_path())
    rows = " and ".join(map(str, ROWS))
    seen = (f"measured here: bf16 linears ran {v['gain']:.2f}x float32's speed "
            f"({hidden}x{intermediate} MLP, {rows} rows")
    if v["dtype"] == "bfloat16":
        return torch.bfloat16, f"{seen}; bf16 needs {MARGIN}x)"
    return torch.float32, f"{seen}; bf16 needs {MARGIN}x, so float32)"
