"""The small-M kernel as a method: decode-sized batches stream a repacked copy of the weight.

Why this module exists: ``csrc/small_gemm.cpp`` reads a weight repacked for a handful of rows
faster than oneDNN or ``F.linear`` on some processors and shapes, and slower on others, so
``nanoserve.cpu.small_gemm.choose`` times it per shape at load and names the largest batch it
takes (``rows``; ``ALL_ROWS`` for every batch). Larger batches go to ``fallback``: oneDNN's
packed weight where that is packed, else ``F.linear`` on the weight as loaded. The kernel sums
in another order than either, so results match them to rounding, not to the bit.

    layer.method = SmallMLinear(layer.weight, layer.bias, rows=8, fallback=OneDNNLinear(...))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoserve.cpu.small_gemm import ALL_ROWS
from nanoserve.layers.linear import OpaqueLinearMethod


class SmallMLinear(OpaqueLinearMethod):
    name = "small_m"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
                 fallback: OpaqueLinearMethod | None = None):
        if rows < 1:
            raise ValueError(f"the small-M kernel takes batches of at most rows >= 1, got {rows}")
        super().__init__(weight.shape[0])
        self.in_features = weight.shape[1]
        self.rows = rows
        self.small = torch.ops.nanoserve.pack_small_gemm(weight.detach())  # its own layout
        self.bias = None if bias is None else bias.detach()
        self.fallback = fallback
        self.weight = None if fallback is not None else weight.detach()  # F.linear beyond

    @classmethod
    def for_layer(cls, layer) -> SmallMLinear:
        """Every batch through the kernel, F.linear for a dtype it does not take."""
        return cls(layer.weight, layer.bias, ALL_ROWS)

    def run(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        rows = x.numel() // self.in_features
        if rows <= self.rows and x.dtype == self.small.dtype:
            out = x.new_empty(*x.shape[:-1], self.out_features)
            torch.ops.nanoserve.small_gemm(out.view(rows, -1), x.view(rows, -1), self.small,
                                           self.bias)
            return out
        if self.fallback is not None:
            return self.fallback.run(x)
        return F.linear(x, self.weight, self.bias)

    def describe(self) -> str:
        upto = "every batch" if self.rows >= ALL_ROWS else f"up to {self.rows} rows"
        beyond = self.fallback.describe() if self.fallback is not None else "F.linear beyond"
        return f"{beyond}, small-M kernel for {upto}"
