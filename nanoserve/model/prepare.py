"""``prepare_model``: what a loaded model computes with, settled once, the same on every rank.

Why this module exists: the loader decides (from measurements and the engine's options) whether
the linears are packed, whether the small-M kernel takes decode batches, and whether the forward
runs through the C++ ops; this applies those decisions to a model, on one rank
(``nanoserve.loader``) or on each tensor-parallel rank (``nanoserve.tp.rank``), through fields
the model declares: each ``Linear``'s method, ``huge_pages``, ``fused_forward`` and
``decode_layer_weights``. A quantized linear arrives with the reference method
(``layers.linear_quant``) and takes the quantized kernels where the small-M kernel may run.
"""

from __future__ import annotations

import logging

from torch import nn

from nanoserve.cpu.fused import fused_forward, layer_weights
from nanoserve.layers.linear_methods import prepack_model, use_method
from nanoserve.layers.linear_quant import quantized_linears

log = logging.getLogger("nanoserve")


def prepare_model(model: nn.Module, prepack: bool, small_gemm: bool, kernels: bool) -> None:
    """``prepack``: oneDNN's packed weights; ``small_gemm``: the small-M kernel where it was
    timed faster, and the quantized kernels for a quantized linear; ``kernels``: the forward
    through the C++ ops, its decode layer loop as one op where every linear has a small-M copy
    or every linear is a quantized kernel's (a model whose linears fall back to the dequantized
    reference, or mix the two, runs them through their methods, in the C++ forward's own
    loop); a family the C++ forward cannot compute (``fused_problem``) keeps its own layers
    (PyTorch), over the same ops' attention."""
    quantized = quantized_linears(model)
    if quantized and small_gemm:
        use_method(model, "quant_kernel")
    if quantized:
        log.info("quantized linears: %s",
                 "; ".join(sorted({m.method.describe() for m in quantized})))
    if prepack or small_gemm:
        prepack_model(model, small_gemm=small_gemm, onednn=prepack)
    if kernels and getattr(model, "fused_problem", None) is None:
        model.fused_forward = fused_forward
        model.decode_layer_weights = layer_weights(model)
        if quantized:
            weights = model.decode_layer_weights
            log.info("decode layer loop as one op: %s", "on, through the quantized kernels up "
                     f"to {weights['rows']} rows" if weights else
                     f"off ({len(quantized)} quantized linears run through their methods)")
