"""AWQ checkpoints (``quant_method: awq``, GEMM version) read into ``QuantizedWeight``.

Why this module exists: AutoAWQ's int4 checkpoints pack the same numbers as GPTQ's the other way
round, and in an order of their own. Per linear layer of N outputs and K inputs in groups of
``group_size`` inputs (G groups):

- ``qweight`` int32 (K, N / 8): unsigned 4-bit values ``u`` packed along the OUTPUTS, eight to a
  word, but interleaved: the word's nibbles, lowest first, hold its output columns
  0, 2, 4, 6, 1, 3, 5, 7 (an order that lets the GPU kernel widen them two at a time);
- ``qzeros`` int32 (G, N / 8): the zero points, stored as they are, in the same interleaving;
- ``scales`` float16 (G, N); a ``bias`` if any.

The weight is ``W[n, k] = (u[n, k] - z[g, n]) * s[g, n]`` with ``g = k // group_size``: always
asymmetric (``zero_point: true``). In the canonical signed form ``q = u - 8``, ``zero = z - 8``.
Layers named in ``modules_to_not_convert`` stay dense and pass through. The other versions
(``gemv``, ``marlin``, ``exllama``: other packings), ``zero_point: false`` and widths other than
4 are refused, naming the key.

    hf = read(hf, {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128,
                   "zero_point": True})
"""

from __future__ import annotations

import torch

from nanoserve.quantization.gptq_format import (
    group_size_of,
    groups,
    quantized_layers,
    setting,
    take,
)
from nanoserve.quantization.packing import unpack_int32
from nanoserve.quantization.weight import QuantizedWeight

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds output column ORDER[i] of its 8
NIBBLE_OF = tuple(ORDER.index(c) for c in range(8))  # column c sits in nibble NIBBLE_OF[c]
STORED = ("qweight", "qzeros", "scales")


def _settings(qc: dict) -> tuple[int, list[str]]:
    if qc.get("quant_method", "awq") != "awq":
        raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: "
                         f"this reader takes awq")
    version = qc.get("version", "gemm")
    if str(version).lower() != "gemm":
        raise ValueError(f"quantization_config.version={version!r} is not supported; nanoserve "
                         f"reads AWQ version 'gemm' (gemv, marlin and exllama pack differently)")
    setting(qc, "bits" if "bits" in qc or "w_bit" not in qc else "w_bit", 4, (4,), "AWQ")
    setting(qc, "zero_point", True, (True,), "AWQ")
    setting(qc, "backend", "autoawq", ("autoawq",), "AWQ")
    key = "group_size" if "group_size" in qc or "q_group_size" not in qc else "q_group_size"
    skip = qc.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise ValueError(f"quantization_config.modules_to_not_convert={skip!r}: a list of "
                         f"module names, or null")
    return group_size_of(qc, key), skip


def read(hf: dict[str, torch.Tensor], quantization_config: dict) -> dict:
    """``hf`` with each layer's ``qweight``/``qzeros``/``scales`` replaced by
    ``<layer>.weight`` -> ``QuantizedWeight``; every other tensor passes through untouched."""
    group_size, skip = _settings(quantization_config)
    out = dict(hf)
    for layer in quantized_layers(hf, STORED, "AWQ"):
        named = [s for s in skip if s and s in layer]  # transformers matches by substring
        if named:
            raise ValueError(f"{layer} is packed (qweight), but "
                             f"quantization_config.modules_to_not_convert names it ({named[0]!r})")
        qweight = take(out, layer, "qweight", "int32")
        qzeros = take(out, layer, "qzeros", "int32")
        scales = take(out, layer, "scales", "float")
        out[f"{layer}.weight"] = read_layer(layer, qweight, qzeros, scales, group_size)
    return out


def unpack_interleaved(packed: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 AWQ words -> (R, 8 C) int8 signed values (``u - 8``) in column order."""
    nibbles = unpack_int32(packed, 4, packed.shape[1] * 8, dim=1)  # (R, 8C), nibble order
    return nibbles.unflatten(1, (-1, 8))[..., list(NIBBLE_OF)].flatten(1)


def read_layer(layer: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> QuantizedWeight:
    """One AWQ GEMM layer's tensors -> its checked ``QuantizedWeight``."""
    K, N = qweight.shape[0], qweight.shape[1] * 8
    gs, G = groups(layer, qweight, K, group_size)
    if tuple(scales.shape) != (G, N):
        raise ValueError(f"{layer}.scales has shape {tuple(scales.shape)}; qweight "
                         f"{tuple(qweight.shape)} ({K} inputs in groups of {gs}, {N} outputs "
                         f"at eight a word) needs ({G}, {N})")
    if tuple(qzeros.shape) != (G, N // 8):
        raise ValueError(f"{layer}.qzeros has shape {tuple(qzeros.shape)}; qweight "
                         f"{tuple(qweight.shape)} with scales {tuple(scales.shape)} needs "
                         f"({G}, {N // 8})")
    q = unpack_interleaved(qweight).t().contiguous()  # (N, K)
    zero = unpack_interleaved(qzeros).t().contiguous()  # (N, G)
    return QuantizedWeight(q, scales.t().contiguous(), zero, 4, gs).check(layer)
