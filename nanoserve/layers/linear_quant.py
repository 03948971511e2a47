"""Linear methods over a quantized weight: the reference, and the kernels with their fallback.

Why this module exists: a quantized checkpoint's linear holds no dense weight at all; its
``QuantizedWeight`` (``nanoserve.quantization.weight``) is held by its method, which is the only
thing that reads it, so the rest of the engine (the layer, tensor parallelism's cut, the fused
forward's calls) is the same as for a dense model. Two methods:

- ``QuantReferenceLinear``: dequantize (in the activations' dtype) and ``F.linear``, every call.
  For W8A8 the activations are first rounded to int8 per token and back (fake quantization),
  which is what the int8 kernel computes exactly. Every kernel is checked against this.
- ``QuantKernelLinear``: decode-sized batches (up to the rows ``quant_gemm.choose`` measured)
  through the C++ kernels, which read the packed integers and widen them in registers; larger
  batches dequantize into one scratch buffer shared by every layer (never a dense copy per
  layer) and run ``F.linear``. Where the kernels cannot run (``quant_gemm.unavailable``) it is
  the reference, and ``describe()`` says why. An act-order weight (GPTQ's ``desc_act``) holds
  its columns sorted by group, so the input is gathered into that order first.

    layer.method = QuantReferenceLinear(qw, bias, torch.float32)
    layer.method = QuantKernelLinear.for_layer(layer)        # from whichever method it holds
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.cpu import quant_gemm
from nanoserve.cpu.small_gemm import ALL_ROWS
from nanoserve.cpu.w8a8_choice import choose_int8
from nanoserve.layers.linear import Linear, OpaqueLinearMethod
from nanoserve.quantization.rtn import fake_quantize_per_token
from nanoserve.quantization.weight import QuantizedWeight

_SCRATCH: dict[torch.dtype, torch.Tensor] = {}  # dtype -> flat buffer, the largest layer's size


def label(qw: QuantizedWeight) -> str:
    """``int4 g32 sym``, ``int8 per channel asym``, ``W8A8 int8``: the scheme in a few words."""
    if qw.act_bits is not None:
        return f"W8A8 int{qw.bits} per channel, int{qw.act_bits} activations per token"
    groups = "per channel" if qw.groups == 1 else f"g{qw.group_size}"
    order = " act order" if qw.perm is not None else ""
    return f"int{qw.bits} {groups} {'sym' if qw.symmetric else 'asym'}{order}"


def reference_linear(qw: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None
                     ) -> torch.Tensor:
    """x (..., K) -> (..., N): dequantize-then-``F.linear`` in x's dtype; W8A8 rounds x to int8
    per token and back first."""
    if qw.act_bits is not None:
        x = fake_quantize_per_token(x)
    return F.linear(x, qw.dequantize(x.dtype), bias)


def dequantize_into(qw: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """``qw``'s (N, K) weight in ``dtype``, columns in ``q``'s (sorted) order, written into the
    shared scratch buffer: valid until the next call. The same values as ``qw.dequantize`` (the
    arithmetic in float32, one rounding to ``dtype``) without the perm's scatter."""
    N, K = qw.shape
    buf = _SCRATCH.get(dtype)
    if buf is None or buf.numel() < N * K:
        with torch.inference_mode(False):  # a normal tensor: written in and out of the mode
            buf = _SCRATCH[dtype] = torch.empty(N * K, dtype=dtype)
    w = buf[:N * K].view(N, qw.groups, qw.group_size)  # (N, G, gs)
    q = qw.q.view(N, qw.groups, qw.group_size)
    if qw.zero is not None:
        q = q.to(torch.int16) - qw.zero.to(torch.int16)[..., None]  # exact, in [-255, 255]
    scale = qw.scale.to(torch.float32)[..., None]  # (N, G, 1)
    if dtype == torch.float32:
        torch.mul(q, scale, out=w)
    else:
        w.copy_(q * scale)
    return w.view(N, K)


class QuantizedLinearMethod(OpaqueLinearMethod):
    """What both methods hold: the weight, the bias and the activations' dtype."""

    quantized = True

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__(qw.shape[0])
        self.qw, self.dtype = qw, dtype
        self.in_features = qw.shape[1]
        self.bias = None if bias is None else bias.detach()

    @classmethod
    def for_layer(cls, layer: Linear) -> QuantizedLinearMethod:
        """This method over the quantized weight ``layer``'s method holds now."""
        held = layer.method
        if not isinstance(held, QuantizedLinearMethod):
            raise ValueError(f"the {cls.name} method computes a quantized weight; this layer "
                             f"({layer.extra_repr()}) holds a dense one")
        return cls(held.qw, held.bias, held.dtype)


class QuantReferenceLinear(QuantizedLinearMethod):
    name = "quant_reference"

    def run(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return reference_linear(self.qw, x, self.bias)

    def describe(self) -> str:
        return f"{label(self.qw)}, dequantized F.linear"


class QuantKernelLinear(QuantizedLinearMethod):
    name = "quant_kernel"

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__(qw, bias, dtype)
        self.why = quant_gemm.unavailable(qw.bits, dtype)
        self.rows = 0
        if self.why is not None:
            return
        N, K = qw.shape
        if qw.act_bits is not None:  # W8A8: one float32 scale per output feature
            self.packed = quant_gemm.pack_int8(qw.q)
            self.scale, self.zero = qw.scale.to(torch.float32).reshape(N).contiguous(), None
            self.rows = choose_int8(N, K, dtype)  # int8 x int8 against the dequantized path
            return
        self.why = quant_gemm.shape_unsupported(K, qw.bits, qw.group_size)
        if self.why is not None:
            return
        self.packed = quant_gemm.pack(qw.q, qw.bits)
        # blocked copies the kernel streams beside the weight (bf16 scales stay 2 bytes)
        self.scale, self.zero = quant_gemm.pack_scales(qw.scale, qw.zero)
        self.rows = int(quant_gemm.choose(N, K, qw.bits, qw.group_size, dtype))

    def run(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        qw = self.qw
        if self.why is not None:
            return reference_linear(qw, x, self.bias)
        if qw.perm is not None:  # q's column j multiplies input perm[j]
            x = x.index_select(-1, qw.perm)
        if x.numel() // self.in_features <= self.rows and x.dtype == self.dtype:
            if qw.act_bits is not None:
                return quant_gemm.int8_gemm(x, self.packed, self.scale, self.bias,
                                            self.out_features)
            return quant_gemm.gemm(x, self.packed, self.scale, self.zero, qw.bits,
                                   qw.group_size, self.bias, self.out_features)
        if qw.act_bits is not None:
            x = fake_quantize_per_token(x)
        return F.linear(x, dequantize_into(qw, x.dtype), self.bias)

    def describe(self) -> str:
        if self.why is not None:
            return f"{label(self.qw)}, dequantized F.linear ({self.why})"
        if self.rows >= ALL_ROWS:
            return f"{label(self.qw)} kernel for every batch"
        if self.rows == 0:
            return f"{label(self.qw)}, dequantized F.linear (the kernel measured slower)"
        return f"{label(self.qw)} kernel up to {self.rows} rows, dequantized F.linear beyond"


def quantized_linears(model: nn.Module) -> list[Linear]:
    """The model's linears whose method holds a quantized weight, in module order."""
    return [m for m in model.modules()
            if isinstance(m, Linear) and isinstance(m.method, QuantizedLinearMethod)]


def install(layer: Linear, qw: QuantizedWeight, dtype: torch.dtype) -> None:
    """``layer`` computes over ``qw`` with the reference method from now on (its bias, if any,
    already loaded); its dense weight is dropped."""
    layer.method = QuantReferenceLinear(qw, layer.bias, dtype)
    layer.weight = None
