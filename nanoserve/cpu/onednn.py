"""oneDNN's packed linear: where it can run, and whether float32 packing pays on this CPU.

Why this module exists: on a CPU, ``F.linear`` hands a bf16 matmul to oneDNN, which first
reorders the (N, E) weight into its blocked layout, on every call. At prefill sizes that copy
hides behind the arithmetic; at decode sizes (a handful of rows) it is most of the call, so a
decode step read its weights at about half the speed the memory allows. Reordering once, when
the model is loaded, and calling oneDNN's linear on the packed weight removes the copy from
every step (the linear method that does it is ``nanoserve.layers.linear_onednn``; this module
says where it can run and whether it pays). Measured on this 2-core x86 CPU (AVX512-BF16, one
torch thread), 8 rows, bf16: 576 -> 1536 went from 130 us to 86 us, and the 576 -> 49152 LM
head from 8.7 ms to 4.5 ms.

In bfloat16 the packed call runs the same oneDNN kernel as ``F.linear`` and gives bit-identical
results, so ``prepack="auto"`` turns it on for bf16 on a CPU. Where the C++ ops are loaded
(``kernels``), a packed shape, bf16 or float32, also keeps a copy of its weight for the small-M
kernel if ``small_gemm.choose`` timed it faster at decode sizes; those batches then sum in
another order (bf16 results within a rounding step, no longer bit-identical to ``F.linear``).

In float32 oneDNN's packed kernel accumulates in another order than ``F.linear`` (differences
near 1e-4 relative), so float32 packs under ``auto`` only where it clearly pays, and that is a
measurement, not a guess: torch's float32 ``F.linear`` goes to MKL, which on one 2-core AMD EPYC
read decode-sized weights at 18-19 GB/s where oneDNN's packed kernel read them at 36-49. At load
the model's own MLP shapes are timed both ways in float32 at 8 and 64 rows, interleaved, and
packing is chosen only at ``FP32_MARGIN`` or more (the geometric mean of the two ratios); the
verdict is cached per CPU model, torch and thread count in ``build/prepack_auto.json``, so one
machine always gives one default, and the reason quotes the ratio.

    LLM(..., prepack="auto")   # bf16 on a CPU: packed; float32: packed where measured faster
    LLM(..., prepack=True)     # packed; refused where oneDNN cannot do it

Under ``compile`` a packed linear is one opaque custom op (``nanoserve::packed_linear``, in
``nanoserve.layers.linear``), so the compiled decode keeps the packed weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nanoserve.config import PREPACK_CHOICES
from nanoserve.cpu import measured
from nanoserve.cpu.measured import DEFAULT_SHAPE, best_interleaved, cached, machine_key

DECODE_ROWS_HINT = 8  # oneDNN picks its blocking for this many rows; any count runs
FP32_ROWS = (8, 64)  # a small decode batch and a full one
FP32_MARGIN = 1.2  # packed float32 sums in another order than F.linear: it must clearly pay


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why packed weights cannot run here, or None when they can."""
    if device.type != "cpu":
        return f"packed weights are a CPU path (device is {device.type})"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"oneDNN packed linear takes bfloat16 or float32, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018  (absent in some builds)
    except (AttributeError, RuntimeError):
        return "this torch build has no mkldnn._reorder_linear_weight"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN reports no bf16 support on this CPU"
    return None


@torch.inference_mode()
def measure_float32(hidden: int, intermediate: int) -> dict[int, float]:
    """``F.linear`` time / packed time in float32 at each of ``FP32_ROWS``, over one MLP's up
    (gate and up fused) and down projections, on random weights of the model's shape."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2 * intermediate, hidden), (hidden, intermediate))  # (N, K) each
    weights = [torch.randn(n, k, generator=g) * k ** -0.5 for n, k in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, DECODE_ROWS_HINT) for w in weights]
    ratios = {}
    for m in FP32_ROWS:
        xs = [torch.randn(m, k, generator=g) for _, k in shapes]
        plain_t, packed_t = best_interleaved(
            [lambda xs=xs: [F.linear(x, w) for x, w in zip(xs, weights, strict=True)],
             lambda xs=xs: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                            for x, p in zip(xs, packed, strict=True)]], 5, 1.0)
        ratios[m] = plain_t / packed_t
    return ratios


def float32_verdict(shape: tuple[int, int]) -> tuple[bool, str]:
    """(pack?, why) for float32 under ``auto``: measured once per machine and shape, cached."""
    hidden, intermediate = shape

    def verdict() -> dict:
        ratios = measure_float32(hidden, intermediate)
        gain = math.prod(ratios.values()) ** (1 / len(ratios))
        return {"pack": gain >= FP32_MARGIN, "gain": round(gain, 3),
                "plain_over_packed": {str(m): round(r, 3) for m, r in ratios.items()}}
    key = f"{machine_key()}|{hidden}x{intermediate}|margin {FP32_MARGIN}"
    v = cached("prepack_auto.json", key, verdict, measured.cache_dir() / "prepack_auto.json")
    seen = (f"float32, measured here: oneDNN's packed linear ran {v['gain']:.2f}x F.linear's "
            f"speed ({hidden}x{intermediate} MLP, {' and '.join(map(str, FP32_ROWS))} rows; "
            f"packing needs {FP32_MARGIN}x")
    return (True, seen + ")") if v["pack"] else (False, seen + ", so plain F.linear)")


def resolve(prepack: bool | str, device: torch.device, dtype: torch.dtype,
            compile: bool | str, shape: tuple[int, int] | None = None) -> tuple[bool, str]:
    """(pack?, why): ``auto`` packs bf16 on a CPU, and float32 where ``float32_verdict`` measured
    it faster for the model's MLP ``shape`` (hidden, intermediate); ``True`` packs or raises a
    ValueError."""
    if prepack not in PREPACK_CHOICES:
        raise ValueError(f"prepack={prepack!r}; choose one of {PREPACK_CHOICES}")
    if prepack is False:
        return False, "prepack=False"
    why_not = unavailable(device, dtype)
    if prepack is True:
        if why_not:
            raise ValueError(f"prepack=True: {why_not}")
        return True, "prepack=True"
    under_compile = " (an opaque op under compile)" if compile else ""
    if why_not:
        return False, why_not
    if dtype == torch.float32:
        pack, why = float32_verdict(shape or DEFAULT_SHAPE)
        return pack, why + (under_compile if pack else "")
    return True, "bf16 on a CPU: weights packed for oneDNN at load" + under_compile
