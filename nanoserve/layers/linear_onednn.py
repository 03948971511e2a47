"""oneDNN's packed linear as a method: the weight reordered once, at load, into oneDNN's layout.

Why this module exists: ``F.linear`` on a CPU hands a bf16 matmul to oneDNN, which reorders the
(N, K) weight into its blocked layout on every call. At decode sizes that copy is most of the
call; reordering once, at load, removes it from every step (``nanoserve.cpu.onednn`` says where
oneDNN can do it and whether float32 packing pays). In bf16 the packed call runs the same kernel
as ``F.linear`` and gives bit-identical results; in float32 it sums in another order.

    layer.method = OneDNNLinear(layer.weight, layer.bias)
"""

from __future__ import annotations

import torch

from nanoserve.cpu.onednn import DECODE_ROWS_HINT
from nanoserve.layers.linear import Linear, OpaqueLinearMethod


class OneDNNLinear(OpaqueLinearMethod):
    name = "onednn"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 rows_hint: int = DECODE_ROWS_HINT):
        super().__init__(weight.shape[0])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint)
        self.bias = None if bias is None else bias.detach()

    @classmethod
    def for_layer(cls, layer: Linear) -> OneDNNLinear:
        return cls(layer.weight, layer.bias)

    def run(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def describe(self) -> str:
        return "packed for oneDNN"


def packed_layer(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    """A ``Linear`` over ``weight`` (N, K) computed by oneDNN's packed method: for benchmarks
    and tests that time or check one packed linear alone."""
    layer = Linear.of(weight, bias)
    layer.method = OneDNNLinear(weight, bias)
    return layer
