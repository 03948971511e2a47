"""Day 75 snapshot (frozen): what the bytes of a decode step allow, and what a Q4_0 dot product
rounds.

A decode step reads every weight once. If memory delivers ``bandwidth`` bytes a second and a
token reads ``step_bytes``, no engine decodes faster than ``bandwidth / step_bytes`` tokens a
second. Two models of the same shape on the same machine therefore differ in speed, at best, by
the ratio of their bytes: the *byte ceiling*. A measured speed-up over that ceiling is the
fraction of the ceiling an engine reaches.

Two ways to multiply a group-32 four-bit weight by an activation:

- ``widened``: the weight's integers times its scale, in the activation's dtype, then an
  ordinary multiply-add (nanoserve's w4a16). Exact to the dequantized weight; only the
  activation's own dtype rounds.
- ``int8_blocks``: the activation rounded too, each block of 32 to int8 with its own scale
  ``max|x| / 127`` (the Q8_0 layout), so that the dot product runs on integers (llama.cpp's
  Q4_0 on x86). Faster per byte, and approximate.

>>> round(ceiling(268_959_744, 116_342_784), 4)
2.3118
>>> fraction_of_ceiling(speedup=1.5, ceiling=3.0)
0.5
>>> seconds_per_token(step_bytes=100e6, bandwidth=20e9)
0.005
>>> import torch
>>> x = torch.tensor([[1.0, -0.5, 0.25, 0.0] * 8])
>>> (x - int8_blocks(x)).abs().max().item() <= 1.0 / 127 / 2
True
>>> q = torch.full((1, 32), 3, dtype=torch.int8)
>>> widened(q, torch.tensor([[0.5 / 3]]), x).item() == (x * 0.5).sum().item()
True
"""

from __future__ import annotations

import torch

BLOCK = 32  # Q4_0's and Q8_0's weights (and Q8_0's activations) per scale


def ceiling(dense_bytes: int, quant_bytes: int) -> float:
    """How much faster a memory-bound step can get by reading ``quant_bytes`` instead."""
    return dense_bytes / quant_bytes


def fraction_of_ceiling(speedup: float, ceiling: float) -> float:
    """The measured speed-up over the dense model as a share of what the bytes allow."""
    return speedup / ceiling


def seconds_per_token(step_bytes: float, bandwidth: float) -> float:
    """The roofline's floor on one decode step: its bytes over the memory's bytes a second."""
    return step_bytes / bandwidth


def widened(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w4a16: q (N, K) integers, scale (N, K / 32), x (M, K) -> (M, N), the weight widened to
    x's dtype before the multiply-adds."""
    w = q.to(x.dtype) * scale.to(x.dtype).repeat_interleave(BLOCK, dim=1)  # (N, K)
    return x @ w.T


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """What the activation stands for once rounded as Q8_0 does: each block of 32 along the
    last dimension to int8 with the scale ``max|x| / 127`` (fp16), returned widened back."""
    b = x.float().reshape(*x.shape[:-1], -1, BLOCK)  # (..., K / 32, 32)
    d = (b.abs().amax(-1, keepdim=True) / 127).half().float()
    q = torch.where(d > 0, b / d.clamp_min(1e-30), torch.zeros_like(b)).round().clamp(-127, 127)
    return (q * d).reshape(x.shape)
