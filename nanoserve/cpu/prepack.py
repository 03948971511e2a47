"""``PackedLinear`` and ``prepack_model``: every linear's weight reordered once, at load.

Why this module exists: the packing that ``onednn.py`` measures, and the small-M copies that
``small_gemm.py`` chooses, are applied to a model here, once, when it is loaded, so that no
decode step pays for a reorder.
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.cpu.onednn import DECODE_ROWS_HINT

# The compiler cannot trace an opaque mkldnn tensor, so under torch.compile a packed linear is
# one custom op that names its weight by a handle (an int the graph keeps as a constant).
_HANDLES = itertools.count()
_BY_HANDLE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@torch.library.custom_op("nanoserve::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """x (..., E) -> (..., N) through the PackedLinear registered under ``handle``."""
    return _BY_HANDLE[handle].run(x)


@packed_linear.register_fake
def _(x, handle, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(nn.Module):
    """``nn.Linear`` with its weight held in oneDNN's blocked layout (an opaque mkldnn tensor),
    a small-M copy for decode-sized batches, or both. Without oneDNN's copy (``onednn=False``:
    oneDNN cannot pack this dtype here, or packing did not pay) the larger batches run
    ``F.linear`` on the weight as loaded."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 rows_hint: int = DECODE_ROWS_HINT, small_rows: int = 0, onednn: bool = True):
        super().__init__()
        if not (onednn or small_rows):
            raise ValueError("a PackedLinear needs oneDNN's packing, a small-M copy, or both")
        self.out_features, self.in_features = weight.shape  # (N, E)
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint)
                       if onednn else None)
        self.weight = None if onednn else weight.detach()
        self.bias = None if bias is None else bias.detach()
        # Batches of at most small_rows rows take csrc/small_gemm.cpp (small_gemm.py chose it
        # for this shape by timing both); they read their own repacked copy of the weight.
        self.small_rows = small_rows
        self.small = (torch.ops.nanoserve.pack_small_gemm(weight.detach()) if small_rows
                      else None)
        self.handle = next(_HANDLES)
        _BY_HANDLE[self.handle] = self

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., N)
        if torch.compiler.is_compiling():  # opaque to the compiler, which keeps the packing
            return torch.ops.nanoserve.packed_linear(x, self.handle, self.out_features)
        return self.run(x)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        # detached: none of these ops has a backward, and oneDNN picks its training primitive
        # for an input that requires grad. On an AVX2 EPYC that primitive had no fast kernel
        # for a weight its 64-row blocks pad (1376 x 256) and ran the reference loop: 127 ms
        # against 0.23 at 7 rows, 1.16 s against 0.65 ms at 64 (one thread).
        x = (x.detach() if x.requires_grad else x).contiguous()  # no extra view on a decode step
        rows = x.numel() // self.in_features
        if self.small is not None and rows <= self.small_rows and x.dtype == self.small.dtype:
            out = x.new_empty(*x.shape[:-1], self.out_features)
            torch.ops.nanoserve.small_gemm(out.view(rows, -1), x.view(rows, -1), self.small,
                                           self.bias)
            return out
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        from nanoserve.cpu.small_gemm import ALL_ROWS

        upto = "every batch" if self.small_rows >= ALL_ROWS else f"up to {self.small_rows} rows"
        small = f", small-M kernel for {upto}" if self.small_rows else ""
        large = "packed for oneDNN" if self.packed is not None else "F.linear beyond"
        return f"in_features={self.in_features}, out_features={self.out_features}, {large}{small}"


def prepack_model(model: nn.Module, small_gemm: bool = False, onednn: bool = True) -> int:
    """Swap the ``nn.Linear`` layers under ``model.layers`` for ``PackedLinear`` ones, and give
    the model a packed LM head (``model.packed_head``). With ``onednn`` every weight is packed
    for oneDNN; with ``small_gemm`` (bf16 or float32, the C++ ops loaded) each shape also takes
    the small-M kernel where ``small_gemm.choose`` measured it faster than the linear it would
    otherwise run (oneDNN's packed one, or ``F.linear`` without ``onednn``). Without
    ``onednn``, a shape the small kernel does not take stays an ``nn.Linear``. Returns how many
    weights were packed."""
    if any(isinstance(m, PackedLinear) for m in model.modules()):  # the head's too
        raise ValueError("this model's weights are already packed")
    if not (onednn or small_gemm):
        raise ValueError("prepack_model: nothing to pack (neither onednn nor small_gemm)")
    against = "onednn" if onednn else "linear"
    chosen: dict[tuple[int, int], int] = {}

    def rows_for(weight: torch.Tensor) -> int:
        if not small_gemm:
            return 0
        if weight.shape not in chosen:  # 0 for a dtype without a kernel (small_gemm.unavailable)
            from nanoserve.cpu.small_gemm import choose
            chosen[weight.shape] = choose(*weight.shape, weight.dtype, against)
        return chosen[weight.shape]

    def packed(weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear | None:
        rows = rows_for(weight)
        if not (onednn or rows):
            return None
        return PackedLinear(weight, bias, small_rows=rows, onednn=onednn)

    count = 0
    for layer in model.layers:
        for parent in list(layer.modules()):  # nested too: a tensor-parallel wrapper's linear
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and (p := packed(child.weight, child.bias)):
                    setattr(parent, name, p)
                    count += 1
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    model.packed_head = packed(head, None)  # tied: the embedding keeps its own copy
    model.small_gemm_rows = {f"{n}x{k}": r for (n, k), r in chosen.items()}
    _small_on_huge_pages(model)
    return count + (model.packed_head is not None)


def small_copies(model: nn.Module) -> list[PackedLinear]:
    """The packed linears that hold a small-M copy of their weight, in module order."""
    return [m for m in model.modules() if isinstance(m, PackedLinear) and m.small is not None]


def _small_on_huge_pages(model: nn.Module) -> None:
    """Move every small-M copy into one mapping on 2 MiB pages (``huge_pages``), which the
    decode step streams; ``model.huge_pages`` says what the kernel granted, or why not."""
    from nanoserve.cpu.huge_pages import place

    owners = small_copies(model)
    views, model.huge_pages = place([m.small for m in owners])
    for m, view in zip(owners, views, strict=True):
        m.small = view
