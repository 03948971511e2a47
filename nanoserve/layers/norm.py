"""RMSNorm, as Hugging Face's Llama computes it: normalise in float32, round, then scale.

Why this module exists: every family normalises its residual stream, and the order of the
rounding is what makes logits match transformers' bit for bit in float32. The variants the next
families need sit beside this one: ``GemmaRMSNorm`` scales by ``(1 + w)`` in float32 and rounds
once, after the scale (Llama rounds before it).

>>> import torch
>>> norm = RMSNorm(4, eps=0.0)  # every square is 4, so the rms is 2
>>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]])).tolist()
[[1.0, -1.0, 1.0, -1.0]]
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the weight is stored as an offset from one (zeros is the identity), and
    normalising and scaling both happen in float32 before one cast back (transformers'
    ``Gemma3RMSNorm``). In bfloat16 this is not ``RMSNorm`` with ``w + 1``: the rounding moves.

    >>> norm = GemmaRMSNorm(4, eps=0.0)  # weight zeros: a scale of 1
    >>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]])).tolist()
    [[1.0, -1.0, 1.0, -1.0]]
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)
