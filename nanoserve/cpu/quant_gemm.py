"""PLACEHOLDER for the quantized small-M kernels (branch q-kern writes the real module).

Why this module exists: ``nanoserve.layers.linear_quant`` calls the quantized kernels through
this interface, fixed before they were written, so the engine's integration could be built and
tested beside them. Until the kernels land every entry point says why it cannot run
(``unavailable``), and the linear method falls back to dequantize-then-``F.linear``.

    why = unavailable(4, torch.bfloat16)                    # None once the kernel runs here
    packed = pack(q, 4)                                      # (N, K) int8 -> the kernel's layout
    y = gemm(x, packed, scale_f32, zero, 4, 32, bias, N)     # x (..., K) -> (..., N)
    rows = choose(N, K, 4, 32, torch.bfloat16)               # the largest batch it takes
"""

from __future__ import annotations

import torch

NOT_BUILT = "the quantized kernels are not built"


def unavailable(bits: int, dtype: torch.dtype) -> str | None:
    """Why no kernel runs ``bits``-bit weights against ``dtype`` activations here, or None."""
    return NOT_BUILT


def _refuse(*_args, **_kwargs):
    raise RuntimeError(NOT_BUILT)


pack = pack_int8 = gemm = int8_gemm = choose = _refuse
