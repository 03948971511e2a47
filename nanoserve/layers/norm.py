"""RMSNorm, as Hugging Face's Llama computes it: normalise in float32, round, then scale.

Why this module exists: every family normalises its residual stream, and the order of the
rounding is what makes logits match transformers' bit for bit in float32. The variants the next
families need (Gemma's ``(1 + w)``, per-head q/k norms) sit beside this one.

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
