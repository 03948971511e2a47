"""The linear methods, by name, and the one step that gives each of a model's linears its own.

Why this module exists: every ``Linear`` starts with the plain method; at load, once, each takes
the method that computes it fastest here, as measured, not guessed (``prepack_model``): oneDNN's
packed weight where the engine packs (``nanoserve.cpu.onednn``), and on top of it, or of
``F.linear``, the small-M kernel for the batch sizes where ``nanoserve.cpu.small_gemm.choose``
timed it faster on this layer's shape. Every small-M copy then moves onto 2 MiB pages, which the
decode step streams (``nanoserve.cpu.huge_pages``). A new method (a quantized format) is one
file and one line of ``LINEAR_METHODS``.

    n = prepack_model(model, small_gemm=True, onednn=True)   # how many linears were prepared
    use_method(model, "onednn")                               # every linear, by name
"""

from __future__ import annotations

import torch
from torch import nn

from nanoserve.config.registries import load_class
from nanoserve.cpu import small_gemm as small_m
from nanoserve.cpu.fused import layer_weights
from nanoserve.cpu.huge_pages import place
from nanoserve.layers.linear import PLAIN, Linear, LinearMethod
from nanoserve.layers.linear_onednn import OneDNNLinear
from nanoserve.layers.linear_quant import quantized_linears
from nanoserve.layers.linear_small_m import SmallMLinear

LINEAR_METHODS = {  # name -> "module:Class"
    "plain": "nanoserve.layers.linear:LinearMethod",  # F.linear on the weight as loaded
    "onednn": "nanoserve.layers.linear_onednn:OneDNNLinear",  # oneDNN's packed layout
    "small_m": "nanoserve.layers.linear_small_m:SmallMLinear",  # the small-M kernel first
    # a quantized weight: dequantize then F.linear; the quantized kernels first
    "quant_reference": "nanoserve.layers.linear_quant:QuantReferenceLinear",
    "quant_kernel": "nanoserve.layers.linear_quant:QuantKernelLinear",
}


def linears(model: nn.Module) -> list[Linear]:
    """The model's linear layers, in module order (the LM head last)."""
    return [m for m in model.modules() if isinstance(m, Linear)]


def small_copies(model: nn.Module) -> list[SmallMLinear]:
    """The methods that hold a small-M copy of their layer's weight, in module order."""
    return [m.method for m in linears(model) if isinstance(m.method, SmallMLinear)]


def prepack_model(model: nn.Module, small_gemm: bool = False, onednn: bool = True) -> int:
    """Give every linear of ``model`` (the LM head included; a tied head packs its own copy of
    the embedding) its method: with ``onednn`` oneDNN's packed weight; with ``small_gemm`` (the
    C++ ops loaded) also the small-M kernel, on every shape where ``small_gemm.choose`` timed it
    faster than the linear it would otherwise run (oneDNN's packed one, or ``F.linear`` without
    ``onednn``). Without ``onednn`` a shape the small kernel does not take stays plain. Sets
    ``model.huge_pages``; returns how many linears were prepared."""
    layers = _unprepared(model)
    if not (onednn or small_gemm):
        raise ValueError("prepack_model: nothing to pack (neither onednn nor small_gemm)")
    against = "onednn" if onednn else "linear"
    chosen: dict[tuple[tuple[int, int], torch.dtype], int] = {}
    count, tied = 0, _embeddings(model)
    for m in layers:
        key = (tuple(m.weight.shape), m.weight.dtype)
        if small_gemm and key not in chosen:  # 0 for a dtype without a kernel
            chosen[key] = small_gemm_rows(m.weight, against)
        rows = chosen.get(key, 0)
        if not (onednn or rows):
            continue
        large = OneDNNLinear(m.weight, m.bias) if onednn else None
        _give(m, SmallMLinear(m.weight, m.bias, rows, large) if rows else large, tied)
        count += 1
    _settle(model)
    return count


def use_method(model: nn.Module, name: str) -> int:
    """Every linear of ``model`` computes with the method registered as ``name``, whatever a
    measurement would choose: for benchmarks and tests that hold one method against another.
    A quantized method takes the quantized linears (whichever quantized method they hold),
    any other the dense ones. Returns how many linears took it."""
    if name not in LINEAR_METHODS:
        raise ValueError(f"linear method {name!r}; choose one of {tuple(LINEAR_METHODS)}")
    method, tied = load_class(LINEAR_METHODS[name]), _embeddings(model)
    quantized = getattr(method, "quantized", False)
    layers = quantized_linears(model) if quantized else _unprepared(model)
    for m in layers:
        _give(m, method.for_layer(m), tied)
    _settle(model)
    return len(layers)


def _unprepared(model: nn.Module) -> list[Linear]:
    """The model's dense linears, refused if any already holds a method of its own (a
    quantized linear's method, chosen at load, is none of prepacking's business)."""
    quantized = {id(m) for m in quantized_linears(model)}
    layers = [m for m in linears(model) if id(m) not in quantized]
    if any(m.method is not PLAIN for m in layers):
        raise ValueError("this model's weights are already packed")
    return layers


def _embeddings(model: nn.Module) -> set[int]:
    """The ids of the embedding tables: a tied head's weight is one of them."""
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _give(layer: Linear, method: LinearMethod, tied: set[int]) -> None:
    """``layer`` computes with ``method`` from now on. A method with its own copy of the
    weight (every one but the plain method) holds all it reads, so the layer lets go of its
    own, which would otherwise stay in memory beside the copy; a tied head's weight is the
    embedding's (``tied``), and stays."""
    layer.method = method
    if method is not PLAIN and id(layer.weight) not in tied:
        layer.weight = None


def _settle(model: nn.Module) -> None:
    """After the methods change: the small-M copies onto huge pages, and the C++ layer loop's
    weights read again where the model runs the C++ forward."""
    _small_on_huge_pages(model)
    if getattr(model, "fused_forward", None) is not None:
        model.decode_layer_weights = layer_weights(model)


def small_gemm_rows(weight: torch.Tensor, against: str) -> int:
    """The largest batch the small-M kernel takes for this weight (0: none), as timed here."""
    return small_m.choose(*weight.shape, weight.dtype, against)


def _small_on_huge_pages(model: nn.Module) -> None:
    """Move every small-M copy into one mapping on 2 MiB pages, which the decode step streams;
    ``model.huge_pages`` says what the kernel granted, or why not."""
    owners = small_copies(model)
    views, model.huge_pages = place([m.small for m in owners])
    for m, view in zip(owners, views, strict=True):
        m.small = view
