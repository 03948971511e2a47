"""Reading a compressed-tensors checkpoint (``quant_method: compressed-tensors``) as it is written.

Why this module exists: compressed-tensors is the format llmcompressor writes and vLLM reads for
its W4A16, W8A16 and W8A8 checkpoints, so reading it without conversion is how nanoserve serves
the quantized models people already have. ``config.json``'s ``quantization_config`` holds one or
more schemes (``config_groups``), each naming the layers it covers (``targets``: ``Linear``, a
layer's name, or ``re:`` and a regular expression over names) and how their weights, and for
W8A8 their inputs, are quantized; ``ignore`` names the layers left dense. Each quantized layer
stores, under its own name (``compressed_tensors_write.py`` says the layouts):

- ``pack-quantized``: ``weight_packed``, ``weight_scale``, ``weight_shape`` and, asymmetric,
  ``weight_zero_point``;
- ``int-quantized`` (W8A8) and ``naive-quantized``: the integers as ``weight`` (int8) and
  ``weight_scale`` (and ``weight_zero_point`` unpacked, asymmetric).

What is read: integer weights of 4 or 8 bits, per output feature (``channel``) or per group of
inputs (``group``), symmetric or asymmetric, and inputs either full precision or int8 per token
at run time (``dynamic``, symmetric). Anything else (floating-point types such as fp8, another
width, a per-tensor or block strategy, act order, static activation scales, sparsity, a quantized
KV cache, a checkpoint not in the ``compressed`` state) is refused with the key, its value and
what is supported: serving it as if it were one of the above would give wrong text.

    hf = read(hf, config["quantization_config"])    # <layer>.weight -> QuantizedWeight
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from nanoserve.quantization.packing import unpack_int32
from nanoserve.quantization.weight import BITS, QuantizedWeight

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
STRATEGIES = ("channel", "group")
STORED = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


@dataclass(frozen=True)
class Scheme:
    """One config group, checked: what its layers' tensors mean."""

    name: str
    targets: tuple[str, ...]
    format: str
    bits: int
    group_size: int | None  # None: one group per output feature
    symmetric: bool
    act_bits: int | None

    def covers(self, layer: str) -> bool:
        """Whether this scheme's targets name ``layer`` (every linear, for ``Linear``)."""
        return any(_matches(t, layer) for t in self.targets)


def _matches(target: str, layer: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], layer) is not None
    return target == layer


def _refuse(key: str, value, supported: str):
    raise ValueError(f"quantization_config.{key}={value!r} is not supported; nanoserve reads "
                     f"{supported}")


def schemes(qc: dict) -> list[Scheme]:
    """The config groups of ``qc``, each checked, in order."""
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        _refuse("quantization_status", status, "'compressed' checkpoints")
    for key in ("sparsity_config", "kv_cache_scheme", "transform_config"):
        if qc.get(key):
            _refuse(key, qc[key], "checkpoints without it")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("quantization_config.config_groups is empty: nothing says how the "
                         "weights are quantized")
    return [_scheme(name, g, qc.get("format")) for name, g in groups.items()]


def _scheme(name: str, group: dict, default_format: str | None) -> Scheme:
    where = f"config_groups.{name}"
    fmt = group.get("format") or default_format
    if fmt not in FORMATS:
        _refuse(f"{where}.format", fmt, ", ".join(FORMATS))
    w = group.get("weights")
    if not w:
        _refuse(f"{where}.weights", w, "integer weights")
    if w.get("type", "int") != "int":
        _refuse(f"{where}.weights.type", w.get("type"), "'int' (4 or 8 bits)")
    bits = w.get("num_bits")
    if bits not in BITS:
        _refuse(f"{where}.weights.num_bits", bits, f"{BITS}")
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        _refuse(f"{where}.weights.strategy", strategy, f"{STRATEGIES}")
    group_size = w.get("group_size") if strategy == "group" else None
    if strategy == "group" and (not isinstance(group_size, int) or group_size < 1):
        _refuse(f"{where}.weights.group_size", group_size, "a positive group size")
    if w.get("actorder"):
        _refuse(f"{where}.weights.actorder", w["actorder"], "weights without act order")
    if w.get("dynamic"):
        _refuse(f"{where}.weights.dynamic", True, "weights quantized ahead of time")
    act = group.get("input_activations")
    act_bits = None
    if act:
        shape = (act.get("type", "int"), act.get("num_bits"), act.get("strategy"),
                 bool(act.get("dynamic")), act.get("symmetric", True))
        if shape != ("int", 8, "token", True, True):
            _refuse(f"{where}.input_activations", act,
                    "none (weight-only) or int8 per token, dynamic and symmetric (W8A8)")
        if bits != 8 or strategy != "channel" or not w.get("symmetric", True):
            _refuse(f"{where}.weights", w, "symmetric int8 weights per channel with int8 "
                                           "activations")
        act_bits = 8
    if group.get("output_activations"):
        _refuse(f"{where}.output_activations", group["output_activations"], "none")
    if fmt == "pack-quantized" and act_bits is not None:
        _refuse(f"{where}.format", fmt, "int-quantized for W8A8")
    targets = tuple(group.get("targets") or ())
    if not targets:
        _refuse(f"{where}.targets", targets, "a list of layers or 'Linear'")
    return Scheme(name, targets, fmt, bits, group_size, bool(w.get("symmetric", True)), act_bits)


def quantized_layers(hf: dict[str, torch.Tensor]) -> list[str]:
    """The layers that store quantized weights: those with a ``weight_scale``."""
    return sorted(k.removesuffix(".weight_scale") for k in hf if k.endswith(".weight_scale"))


def read(hf: dict[str, torch.Tensor], qc: dict) -> dict:
    """``hf`` with each quantized layer's tensors replaced by ``<layer>.weight`` ->
    ``QuantizedWeight``; a layer in ``ignore`` must be stored dense."""
    found = schemes(qc)
    ignore = tuple(qc.get("ignore") or ())
    out = dict(hf)
    for layer in quantized_layers(hf):
        if any(_matches(t, layer) for t in ignore):
            raise ValueError(f"{layer}: quantization_config.ignore names it, but the checkpoint "
                             f"stores it quantized ({layer}.weight_scale)")
        scheme = next((s for s in found if s.covers(layer)), None)
        if scheme is None:
            raise ValueError(f"{layer}: stored quantized, but no config group targets it")
        for key in (*STORED, "weight"):
            out.pop(f"{layer}.{key}", None)
        out[f"{layer}.weight"] = _layer(hf, layer, scheme)
    return out


def _take(hf: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in hf:
        raise ValueError(f"checkpoint is missing tensor {name!r}")
    return hf[name]


def _layer(hf: dict[str, torch.Tensor], layer: str, s: Scheme) -> QuantizedWeight:
    scale = _take(hf, f"{layer}.weight_scale")
    if s.format == "pack-quantized":
        shape = _take(hf, f"{layer}.weight_shape")
        if shape.numel() != 2:
            raise ValueError(f"{layer}.weight_shape holds {shape.tolist()}, not [N, K]")
        N, K = (int(v) for v in shape.tolist())
        packed = _take(hf, f"{layer}.weight_packed")
        words = -(-K * s.bits // 32)
        if tuple(packed.shape) != (N, words) or packed.dtype != torch.int32:
            raise ValueError(f"{layer}.weight_packed has shape {tuple(packed.shape)} "
                             f"{packed.dtype}; weight_shape [{N}, {K}] at {s.bits} bits needs "
                             f"int32 ({N}, {words})")
        q = unpack_int32(packed, s.bits, K)
    else:
        q = _take(hf, f"{layer}.weight")
        if q.dim() != 2 or q.dtype != torch.int8:
            raise ValueError(f"{layer}.weight has shape {tuple(q.shape)} {q.dtype}; "
                             f"{s.format} stores (N, K) int8")
        N, K = q.shape
    group_size = K if s.group_size is None else s.group_size
    if K % group_size:
        raise ValueError(f"{layer}: group_size {group_size} does not divide the {K} inputs "
                         f"of weight ({N}, {K})")
    G = K // group_size
    if tuple(scale.shape) != (N, G):
        raise ValueError(f"{layer}.weight_scale has shape {tuple(scale.shape)}; a ({N}, {K}) "
                         f"weight in groups of {group_size} needs ({N}, {G})")
    zero = None
    if not s.symmetric:
        z = _take(hf, f"{layer}.weight_zero_point")
        if s.format == "pack-quantized":
            rows = -(-N * s.bits // 32)
            if tuple(z.shape) != (rows, G) or z.dtype != torch.int32:
                raise ValueError(f"{layer}.weight_zero_point has shape {tuple(z.shape)} "
                                 f"{z.dtype}; ({N}, {G}) zero points at {s.bits} bits pack "
                                 f"into int32 ({rows}, {G})")
            zero = unpack_int32(z, s.bits, N, dim=0)
        else:
            if tuple(z.shape) != (N, G):
                raise ValueError(f"{layer}.weight_zero_point has shape {tuple(z.shape)}; "
                                 f"needs ({N}, {G})")
            zero = z.to(torch.int8)
    return QuantizedWeight(q, scale, zero, s.bits, group_size, None, s.act_bits).check(layer)
