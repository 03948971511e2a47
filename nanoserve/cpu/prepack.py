"""Pre-packed CPU weights: every linear's weight reordered once, at load, for oneDNN.

Why this module exists: on a CPU, ``F.linear`` hands a bf16 matmul to oneDNN, which first
reorders the (N, E) weight into its blocked layout, on every call. At prefill sizes that copy
hides behind the arithmetic; at decode sizes (a handful of rows) it is most of the call, so a
decode step read its weights at about half the speed the memory allows. Reordering once, when
the model is loaded, and calling oneDNN's linear on the packed weight removes the copy from
every step. Measured on this 2-core x86 CPU (AVX512-BF16, one torch thread), 8 rows, bf16:
576 -> 1536 went from 130 us to 86 us, and the 576 -> 49152 LM head from 8.7 ms to 4.5 ms.

In bfloat16 the packed call runs the same oneDNN kernel as ``F.linear`` and gives bit-identical
results, so ``prepack="auto"`` turns it on for bf16 on a CPU. Where the C++ ops are loaded
(``kernels``), a packed shape, bf16 or float32, also keeps a copy of its weight for the small-M
kernel if ``small_gemm.choose`` timed it faster at decode sizes; those batches then sum in
another order (bf16 results within a rounding step, no longer bit-identical to ``F.linear``).

In float32 oneDNN's packed kernel accumulates in another order than ``F.linear`` (differences
near 1e-4 relative), so float32 packs under ``auto`` only where it clearly pays, and that is a
measurement, not a guess: torch's float32 ``F.linear`` goes to MKL, which on one 2-core AMD EPYC
read decode-sized weights at 18-19 GB/s where oneDNN's packed kernel read them at 36-49. At load
the model's own MLP shapes are timed both ways in float32 at 8 and 64 rows, interleaved, and
packing is chosen only at ``FP32_MARGIN`` or more (the geometric mean of the two ratios); the
verdict is cached per CPU model, torch and thread count in ``build/prepack_auto.json``, so one
machine always gives one default, and the reason quotes the ratio.

    LLM(..., prepack="auto")   # bf16 on a CPU: packed; float32: packed where measured faster
    LLM(..., prepack=True)     # packed; refused where oneDNN cannot do it

Under ``compile`` a packed linear is one opaque custom op (``nanoserve::packed_linear``), so the
compiled decode keeps the packed weights instead of tracing ``F.linear``.
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.config import PREPACK_CHOICES

DECODE_ROWS_HINT = 8  # oneDNN picks its blocking for this many rows; any count runs
FP32_ROWS = (8, 64)  # a small decode batch and a full one
FP32_MARGIN = 1.2  # packed float32 sums in another order than F.linear: it must clearly pay


def unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why packed weights cannot run here, or None when they can."""
    if device.type != "cpu":
        return f"packed weights are a CPU path (device is {device.type})"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"oneDNN packed linear takes bfloat16 or float32, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018  (absent in some builds)
    except (AttributeError, RuntimeError):
        return "this torch build has no mkldnn._reorder_linear_weight"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN reports no bf16 support on this CPU"
    return None


@torch.inference_mode()
def measure_float32(hidden: int, intermediate: int) -> dict[int, float]:
    """``F.linear`` time / packed time in float32 at each of ``FP32_ROWS``, over one MLP's up
    (gate and up fused) and down projections, on random weights of the model's shape."""
    from nanoserve.cpu.measured import best_interleaved

    g = torch.Generator().manual_seed(0)
    shapes = ((2 * intermediate, hidden), (hidden, intermediate))  # (N, K) each
    weights = [torch.randn(n, k, generator=g) * k ** -0.5 for n, k in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, DECODE_ROWS_HINT) for w in weights]
    ratios = {}
    for m in FP32_ROWS:
        xs = [torch.randn(m, k, generator=g) for _, k in shapes]
        plain_t, packed_t = best_interleaved(
            [lambda xs=xs: [F.linear(x, w) for x, w in zip(xs, weights, strict=True)],
             lambda xs=xs: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                            for x, p in zip(xs, packed, strict=True)]], 5, 1.0)
        ratios[m] = plain_t / packed_t
    return ratios


def float32_verdict(shape: tuple[int, int]) -> tuple[bool, str]:
    """(pack?, why) for float32 under ``auto``: measured once per machine and shape, cached."""
    import math

    from nanoserve.cpu.measured import cache_dir, cached, machine_key

    hidden, intermediate = shape

    def verdict() -> dict:
        ratios = measure_float32(hidden, intermediate)
        gain = math.prod(ratios.values()) ** (1 / len(ratios))
        return {"pack": gain >= FP32_MARGIN, "gain": round(gain, 3),
                "plain_over_packed": {str(m): round(r, 3) for m, r in ratios.items()}}
    key = f"{machine_key()}|{hidden}x{intermediate}|margin {FP32_MARGIN}"
    v = cached("prepack_auto.json", key, verdict, cache_dir() / "prepack_auto.json")
    seen = (f"float32, measured here: oneDNN's packed linear ran {v['gain']:.2f}x F.linear's "
            f"speed ({hidden}x{intermediate} MLP, {' and '.join(map(str, FP32_ROWS))} rows; "
            f"packing needs {FP32_MARGIN}x")
    return (True, seen + ")") if v["pack"] else (False, seen + ", so plain F.linear)")


def resolve(prepack: bool | str, device: torch.device, dtype: torch.dtype,
            compile: bool | str, shape: tuple[int, int] | None = None) -> tuple[bool, str]:
    """(pack?, why): ``auto`` packs bf16 on a CPU, and float32 where ``float32_verdict`` measured
    it faster for the model's MLP ``shape`` (hidden, intermediate); ``True`` packs or raises a
    ValueError."""
    if prepack not in PREPACK_CHOICES:
        raise ValueError(f"prepack={prepack!r}; choose one of {PREPACK_CHOICES}")
    if prepack is False:
        return False, "prepack=False"
    why_not = unavailable(device, dtype)
    if prepack is True:
        if why_not:
            raise ValueError(f"prepack=True: {why_not}")
        return True, "prepack=True"
    under_compile = " (an opaque op under compile)" if compile else ""
    if why_not:
        return False, why_not
    if dtype == torch.float32:
        from nanoserve.cpu.auto_dtype import DEFAULT_SHAPE

        pack, why = float32_verdict(shape or DEFAULT_SHAPE)
        return pack, why + (under_compile if pack else "")
    return True, "bf16 on a CPU: weights packed for oneDNN at load" + under_compile


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
