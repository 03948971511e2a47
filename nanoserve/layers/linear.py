"""``Linear``: a linear layer that holds a *linear method*, and how tensor parallelism splits it.

Why this module exists: on a CPU a decode step's speed is how fast its linears stream their
weights, and the fastest way differs by processor, dtype and batch size (oneDNN's packed layout,
the small-M kernel, plain ``F.linear``); the next step is quantized weights, with layouts of
their own. So a layer does not decide how it multiplies: it holds a ``LinearMethod``, chosen once
at load (``linear_methods.prepack_model``), as vLLM's layers hold a ``quant_method``. Every
model's linears start with the plain method, so a model built by hand, or trained, is an
ordinary ``nn.Linear`` in all but name.

How tensor parallelism cuts a layer is the layer's own property, whatever its method holds:
``parallel="column"`` (each rank holds some output features: q, k and v, gate and up) or
``"row"`` (some input features; the ranks' partial sums are added by ``all_reduce``, which a
tensor-parallel model sets on its row-parallel layers). A quantized method is then split the
same way as a plain one, with no method per split.

    layer = Linear(576, 1536, parallel="column")   # a plain F.linear until prepared
    y = layer(x)                                    # (..., 576) -> (..., 1536)
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

PARALLEL = (None, "column", "row")  # replicated; output features split; input features split


class LinearMethod:
    """How a ``Linear`` computes ``x W^T + b``. The plain method: ``F.linear`` on the layer's
    own weight, in the order transformers sums it."""

    name: ClassVar[str] = "plain"

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return F.linear(x, layer.weight, layer.bias)

    def describe(self) -> str:
        return "F.linear"

    @classmethod
    def for_layer(cls, layer: Linear) -> LinearMethod:
        """This method for ``layer``, whatever would be measured (``use_method``)."""
        return PLAIN


PLAIN = LinearMethod()  # stateless: every unprepared layer shares it


# The compiler cannot trace an opaque mkldnn tensor or a repacked copy, so under torch.compile
# such a method is one custom op that names it by a handle (an int the graph keeps as a constant).
_HANDLES = itertools.count()
_BY_HANDLE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@torch.library.custom_op("nanoserve::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """x (..., K) -> (..., N) through the method registered under ``handle``."""
    return _BY_HANDLE[handle].run(x)


@packed_linear.register_fake
def _(x, handle, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


class OpaqueLinearMethod(LinearMethod):
    """A method that holds its own copy of the weight in a layout of its own: one custom op
    under ``torch.compile``, ``run`` on the detached input otherwise."""

    def __init__(self, out_features: int):
        self.out_features = out_features
        self.handle = next(_HANDLES)
        _BY_HANDLE[self.handle] = self

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # opaque to the compiler, which keeps the packing
            return torch.ops.nanoserve.packed_linear(x, self.handle, self.out_features)
        # detached: none of these ops has a backward, and oneDNN picks its training primitive
        # for an input that requires grad. On an AVX2 EPYC that primitive had no fast kernel
        # for a weight its 64-row blocks pad (1376 x 256) and ran the reference loop: 127 ms
        # against 0.23 at 7 rows, 1.16 s against 0.65 ms at 64 (one thread).
        return self.run((x.detach() if x.requires_grad else x).contiguous())

    def run(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Linear(nn.Linear):
    """``nn.Linear`` (its parameters, names and initialisation) whose product is its method's.
    ``parallel`` says how tensor parallelism splits it; ``all_reduce``, set on a row-parallel
    layer of a tensor-parallel model, sums the ranks' partial products."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 parallel: str | None = None, device=None, dtype=None):
        if parallel not in PARALLEL:
            raise ValueError(f"parallel={parallel!r}; choose one of {PARALLEL}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.parallel = parallel
        self.method: LinearMethod = PLAIN
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        """A layer over an existing (N, K) weight, for benchmarks and tests."""
        layer = cls(weight.shape[1], weight.shape[0], bias is not None, device="meta")
        layer.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias, requires_grad=False)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(self, x)
        return y if self.all_reduce is None else self.all_reduce(y.contiguous())

    def extra_repr(self) -> str:
        split = f", {self.parallel}-parallel" if self.parallel else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}{split}, {self.method.describe()}")
