"""Day 72 snapshot (frozen): a group of weights rounded to a signed integer grid, and back.

A b-bit signed integer takes 2**b values, from -2**(b-1) to 2**(b-1) - 1: for 4 bits, -8 to 7.
A group of weights shares one step (the scale); each weight becomes the integer nearest
``w / scale``, clamped to that range, and stands for ``q * scale`` (symmetric). The asymmetric
grid slides by an integer zero point so that the group's own minimum and maximum span it:
``w ~ (q - zero) * scale``.

The symmetric scale is the group's largest magnitude over half the grid's span, ``(qmax - qmin)
/ 2``: 7.5 for 4 bits. Then the largest weight sits at +-7.5 steps, half a step past 7 (it rounds
to 8 and is clamped back to 7) or on -7.5 (which rounds to -8): either way half a step off, and
no weight is off by more. ``divisor`` other than 7.5 shows what else could be chosen.

>>> import torch
>>> w = torch.tensor([[0.30, -0.12, 0.05, -0.01]], dtype=torch.float64)
>>> deq, scale = quantize_group(w, bits=4)
>>> round(scale.item(), 4), [round(v, 4) for v in (deq / scale).flatten().tolist()]
(0.04, [7.0, -3.0, 1.0, 0.0])
>>> bool(((w - deq).abs() <= scale / 2 + 1e-12).all())
True
>>> deq, scale = quantize_group(w, bits=4, symmetric=False)
>>> round(scale.item(), 4), [round(v, 3) for v in deq.flatten().tolist()]
(0.028, [0.308, -0.112, 0.056, 0.0])
>>> [hex(x) for x in pack_nibbles(torch.tensor([[-8, -1, 0, 7, 1, 2, 3, 4]]))]
['0xcba9f870']
"""

from __future__ import annotations

import torch


def quantize_group(w: torch.Tensor, bits: int, symmetric: bool = True,
                   divisor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``w`` (G, gs) is a group -> (the values it stands for (G, gs), scale (G, 1))."""
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    lo = w.amin(1, keepdim=True).clamp(max=0)  # 0 is always on the grid
    hi = w.amax(1, keepdim=True).clamp(min=0)
    if symmetric:
        scale = torch.maximum(-lo, hi) / (divisor or (qmax - qmin) / 2)
        zero = torch.zeros_like(scale)
    else:
        scale = (hi - lo) / (qmax - qmin)
        zero = (qmin - torch.round(lo / scale)).clamp(qmin, qmax)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (torch.round(w / scale) + zero).clamp(qmin, qmax)
    return (q - zero) * scale, scale


def pack_nibbles(q: torch.Tensor) -> list[int]:
    """Signed 4-bit values (R, 8k) -> unsigned 32-bit words, eight a word, the first lowest."""
    u = (q.to(torch.int64) + 8).reshape(-1, 8)  # offset to 0..15
    return [sum(int(v) << (4 * i) for i, v in enumerate(row)) for row in u]
