"""Round-to-nearest: the simplest quantizer, and the baseline GPTQ is measured against.

Why this module exists: every scheme here needs a scale (and, asymmetric, a zero point) per
group of inputs and the integers nearest to ``w / scale``. The choices follow compressed-tensors'
min-max observer, so that a checkpoint this package writes holds what llmcompressor's RTN would:

- symmetric: ``scale = max|w| / ((qmax - qmin) / 2)``, e.g. ``max|w| / 7.5`` for 4 bits, no zero
  point; ``q = clamp(round(w / scale), qmin, qmax)``;
- asymmetric: the group's range stretched to include 0, ``scale = (max - min) / (qmax - qmin)``,
  ``zero = clamp(qmin - round(min / scale), qmin, qmax)``, ``q = clamp(round(w / scale) + zero)``.

A scale of zero (an all-zero group) becomes 1, so that dequantizing gives the zeros back.

    qw = quantize_rtn(w, bits=4, group_size=32, symmetric=True)   # w: (N, K) float
    x8, sx = quantize_per_token(x)       # W8A8's activations: int8 per row, and each row's scale
"""

from __future__ import annotations

import torch

from nanoserve.quantization.weight import QuantizedWeight


def int_range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def scales_and_zeros(w: torch.Tensor, bits: int, symmetric: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row of ``w`` (..., gs): its scale (...,) float32 and zero point (...,) int8 or None."""
    qmin, qmax = int_range(bits)
    w = w.to(torch.float32)
    lo = w.amin(-1).clamp(max=0)
    hi = w.amax(-1).clamp(min=0)
    if symmetric:
        scale = torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2)
        return torch.where(scale == 0, torch.ones_like(scale), scale), None
    scale = (hi - lo) / (qmax - qmin)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = (qmin - torch.round(lo / scale)).clamp(qmin, qmax).to(torch.int8)
    return scale, zero


def round_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                  bits: int) -> torch.Tensor:
    """The integers nearest ``w / scale`` (plus the zero point), clamped to ``bits``: w (..., gs),
    scale and zero (...,) -> int8 (..., gs)."""
    qmin, qmax = int_range(bits)
    q = torch.round(w.to(torch.float32) / scale[..., None])
    if zero is not None:
        q = q + zero[..., None].to(torch.float32)
    return q.clamp(qmin, qmax).to(torch.int8)


def quantize_rtn(w: torch.Tensor, bits: int, group_size: int | None = None,
                 symmetric: bool = True, scale_dtype: torch.dtype | None = None
                 ) -> QuantizedWeight:
    """``w`` (N, K) rounded to ``bits`` in groups of ``group_size`` inputs (None: one group per
    output feature). Scales are computed in float32 and stored in ``scale_dtype`` (default
    ``w``'s dtype), and the integers are rounded against the stored scale, so that dequantizing
    reproduces exactly what was rounded."""
    N, K = w.shape
    gs = K if group_size is None else group_size
    if gs < 1 or K % gs:
        raise ValueError(f"group_size {gs} does not divide the {K} inputs of a {(N, K)} weight")
    groups = w.to(torch.float32).reshape(N, K // gs, gs)  # (N, G, gs)
    scale, zero = scales_and_zeros(groups, bits, symmetric)
    scale = scale.to(scale_dtype or w.dtype)
    q = round_to_grid(groups, scale.to(torch.float32), zero, bits).reshape(N, K)
    return QuantizedWeight(q, scale, zero, bits, gs).check("quantize_rtn")


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's activations: each row of ``x`` (..., K) to int8, symmetric, its own scale
    ``max|x| / 127`` -> (int8 (..., K), float32 (..., 1))."""
    x = x.to(torch.float32)
    scale = x.abs().amax(-1, keepdim=True) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(x / scale).clamp(-128, 127).to(torch.int8), scale


def fake_quantize_per_token(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to int8 per token and back, in its own dtype: W8A8's reference input."""
    q, scale = quantize_per_token(x)
    return (q.to(torch.float32) * scale).to(x.dtype)
