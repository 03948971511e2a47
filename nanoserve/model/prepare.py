"""``prepare_model``: what a loaded model computes with, settled once, the same on every rank.

Why this module exists: the loader decides (from measurements and the engine's options) whether
the linears are packed, whether the small-M kernel takes decode batches, and whether the forward
runs through the C++ ops; this applies those decisions to a model, on one rank
(``nanoserve.loader``) or on each tensor-parallel rank (``nanoserve.tp.rank``), through fields
the model declares: each ``Linear``'s method, ``huge_pages``, ``fused_forward`` and
``decode_layer_weights``.
"""

from __future__ import annotations

from torch import nn

from nanoserve.cpu.fused import fused_forward, layer_weights
from nanoserve.layers.linear_methods import prepack_model


def prepare_model(model: nn.Module, prepack: bool, small_gemm: bool, kernels: bool) -> None:
    """``prepack``: oneDNN's packed weights; ``small_gemm``: the small-M kernel where it was
    timed faster; ``kernels``: the forward through the C++ ops, its decode layer loop as one op
    where every linear has a small-M copy; a family the C++ forward cannot compute
    (``fused_problem``) keeps its own layers (PyTorch), over the same ops' attention."""
    if prepack or small_gemm:
        prepack_model(model, small_gemm=small_gemm, onednn=prepack)
    if kernels and getattr(model, "fused_problem", None) is None:
        model.fused_forward = fused_forward
        model.decode_layer_weights = layer_weights(model)
