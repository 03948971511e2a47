"""GPTQ checkpoints (``quant_method: gptq``) read into ``QuantizedWeight``.

Why this module exists: AutoGPTQ and GPTQModel wrote most of the int4 checkpoints on the Hub, in a
packing of their own. Per linear layer of N outputs and K inputs, in groups of ``group_size``
inputs (G groups; ``group_size: -1`` is one group of all K):

- ``qweight`` int32 (K * bits / 32, N): unsigned values ``u`` in [0, 2**bits), packed along the
  INPUTS, ``32 // bits`` to a word, the first input in the lowest bits;
- ``qzeros`` int32 (G, ceil(N * bits / 32)): the zero points, packed the same way along the
  OUTPUTS;
- ``scales`` float16 (G, N); ``g_idx`` int32 (K,): the group of each input; a ``bias`` if any.

The weight is ``W[n, k] = (u[n, k] - z[g, n]) * s[g, n]`` with ``g = g_idx[k]``. The original
format (``checkpoint_format: gptq``) stores each zero point minus one; ``gptq_v2`` stores it as
is. The canonical form is the signed one, so ``q = u - 2**(bits-1)`` and ``zero = z - 2**(bits-1)``;
a symmetric checkpoint (``sym``) has every zero point at ``2**(bits-1)`` (canonical 0), and one
whose zeros say otherwise is refused rather than half-trusted.

Act order (``desc_act``): GPTQ quantized the inputs in order of importance, so ``g_idx`` is not
``k // group_size``. The columns are sorted by group (stably) so that groups are contiguous, and
the order is kept in ``perm``; a ``g_idx`` that is ``k // group_size`` gives no ``perm``.

A zero point stored as ``2**bits - 1`` in the original format would mean a true zero of
``2**bits``, which no value can reach: writers produce it when a true zero of 0 underflows
(AutoGPTQ's ``zeros - 1``), and the borrow corrupts the neighbouring zeros of the same word, so
it is refused, naming the tensor. Which layers are quantized is read from the tensors (those with
a ``qweight``), so a quantized head (``lm_head: true``) needs nothing more; a layer whose inputs
end in a part-filled group (AutoGPTQ rounds the group count up) is refused, since the canonical
form holds whole groups only.

    hf = read(hf, {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                   "desc_act": False})
    hf["model.layers.0.self_attn.q_proj.weight"]     # a QuantizedWeight
"""

from __future__ import annotations

import torch

from nanoserve.quantization.packing import unpack_int32
from nanoserve.quantization.weight import QuantizedWeight

BITS = (4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
STORED = ("qweight", "qzeros", "scales", "g_idx")  # one layer's tensors, by suffix


def setting(qc: dict, key: str, default, allowed: tuple, method: str):
    """``qc[key]`` (or ``default``) if it is one of ``allowed``, else a ValueError naming the key,
    the value and what is supported."""
    value = qc.get(key, default)
    if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        raise ValueError(f"quantization_config.{key}={value!r} is not supported; nanoserve reads "
                         f"{method} with {key} in {list(allowed)}")
    return value


def group_size_of(qc: dict, key: str = "group_size", default=128) -> int:
    gs = qc.get(key, default)
    if isinstance(gs, bool) or not isinstance(gs, int) or (gs < 1 and gs != -1):
        raise ValueError(f"quantization_config.{key}={gs!r} is not supported; a positive "
                         f"number of inputs per group, or -1 for one group per output feature")
    return gs


def quantized_layers(hf: dict, stored: tuple[str, ...], method: str) -> list[str]:
    """The layers that hold ``<layer>.qweight``; a stray part of one (``qzeros`` or ``g_idx``
    without its ``qweight``) or a layer stored both dense and quantized is refused."""
    layers = sorted(k[:-len(".qweight")] for k in hf if k.endswith(".qweight"))
    have = set(layers)
    for key in hf:
        layer, _, suffix = key.rpartition(".")
        if suffix in ("qzeros", "g_idx") and suffix in stored and layer not in have:
            raise ValueError(f"{layer}.qweight is missing: the checkpoint holds {key} but not "
                             f"the packed weight it belongs to ({method} stores "
                             f"{', '.join(stored)})")
    for layer in layers:
        if f"{layer}.weight" in hf:
            raise ValueError(f"{layer}: the checkpoint holds both a dense {layer}.weight "
                             f"{tuple(hf[layer + '.weight'].shape)} and a packed qweight")
    return layers


def take(out: dict, layer: str, suffix: str, dtype_kind: str, required: bool = True):
    """Pop ``<layer>.<suffix>`` from ``out``, checking that it is 2-D (or 1-D for ``g_idx``) and
    int32 or floating as ``dtype_kind`` says."""
    name = f"{layer}.{suffix}"
    t = out.pop(name, None)
    if t is None:
        if required:
            raise ValueError(f"{name} is missing: a quantized layer stores qweight, qzeros and "
                             f"scales")
        return None
    dims = 1 if suffix == "g_idx" else 2
    ok = {"int32": t.dtype == torch.int32, "int": not t.is_floating_point() and t.dtype !=
          torch.bool, "float": t.is_floating_point()}[dtype_kind]
    if t.dim() != dims or not ok:
        raise ValueError(f"{name}: expected a {dims}-D {dtype_kind} tensor, got "
                         f"{tuple(t.shape)} {t.dtype}")
    return t


def _settings(qc: dict) -> tuple[int, int, bool, bool, bool]:
    if qc.get("quant_method", "gptq") != "gptq":
        raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: "
                         f"this reader takes gptq")
    bits = setting(qc, "bits", None, BITS, "GPTQ")
    group_size = group_size_of(qc)
    sym = setting(qc, "sym", True, (True, False), "GPTQ")
    desc_act = setting(qc, "desc_act", False, (True, False), "GPTQ")
    key = "checkpoint_format" if "checkpoint_format" in qc or "format" not in qc else "format"
    fmt = setting(qc, key, "gptq", CHECKPOINT_FORMATS, "GPTQ")
    setting(qc, "pack_dtype", "int32", ("int32",), "GPTQ")
    if qc.get("dynamic"):
        raise ValueError(f"quantization_config.dynamic={qc['dynamic']!r}: per-module overrides "
                         f"of bits or group size are not supported; nanoserve reads GPTQ with "
                         f"one setting for every layer")
    return bits, group_size, sym, desc_act, fmt == "gptq_v2"


def read(hf: dict[str, torch.Tensor], quantization_config: dict) -> dict:
    """``hf`` with each layer's ``qweight``/``qzeros``/``scales``/``g_idx`` replaced by
    ``<layer>.weight`` -> ``QuantizedWeight``; every other tensor passes through untouched."""
    bits, group_size, sym, desc_act, v2 = _settings(quantization_config)
    out = dict(hf)
    for layer in quantized_layers(hf, STORED, "GPTQ"):
        qweight = take(out, layer, "qweight", "int32")
        qzeros = take(out, layer, "qzeros", "int32")
        scales = take(out, layer, "scales", "float")
        g_idx = take(out, layer, "g_idx", "int", required=desc_act)
        out[f"{layer}.weight"] = read_layer(layer, qweight, qzeros, scales, g_idx, bits=bits,
                                            group_size=group_size, sym=sym, desc_act=desc_act,
                                            v2=v2)
    return out


def groups(layer: str, qweight: torch.Tensor, K: int, group_size: int) -> tuple[int, int]:
    """(inputs per group, groups) for a layer of ``K`` inputs; -1 is one group of all of them,
    and a size that does not divide K is refused naming ``<layer>.qweight``."""
    gs = K if group_size == -1 else group_size
    if K % gs:
        raise ValueError(f"{layer}.qweight {tuple(qweight.shape)} holds {K} inputs, which "
                         f"group_size {gs} does not divide")
    return gs, K // gs


def read_layer(layer: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               g_idx: torch.Tensor | None, *, bits: int, group_size: int, sym: bool,
               desc_act: bool, v2: bool) -> QuantizedWeight:
    """One GPTQ layer's tensors -> its checked ``QuantizedWeight``."""
    per = 32 // bits
    K, N = qweight.shape[0] * per, qweight.shape[1]
    gs, G = groups(layer, qweight, K, group_size)
    if tuple(scales.shape) != (G, N):
        raise ValueError(f"{layer}.scales has shape {tuple(scales.shape)}; qweight "
                         f"{tuple(qweight.shape)} ({N} outputs, {K} inputs in groups of {gs}) "
                         f"needs ({G}, {N})")
    if tuple(qzeros.shape) != (G, -(-N // per)):
        raise ValueError(f"{layer}.qzeros has shape {tuple(qzeros.shape)}; qweight "
                         f"{tuple(qweight.shape)} with scales {tuple(scales.shape)} needs "
                         f"({G}, {-(-N // per)}) ({per} {bits}-bit zero points a word)")
    q = unpack_int32(qweight, bits, K, dim=0).t()  # (N, K): u - 2**(bits-1)
    zero = unpack_int32(qzeros, bits, N, dim=1).t().contiguous()  # (N, G): stored - 2**(b-1)
    if not v2:
        top = (1 << (bits - 1)) - 1  # a stored 2**bits - 1
        if bool((zero == top).any()):
            raise ValueError(f"{layer}.qzeros stores a zero point of {2 ** bits - 1}, a true "
                             f"zero of {2 ** bits} in checkpoint_format gptq (stored minus one): "
                             f"outside {bits}-bit range, the mark of a zero of 0 that underflowed "
                             f"when written")
        zero = zero + 1
    if sym:
        if bool((zero != 0).any()):
            n, g = (zero != 0).nonzero()[0].tolist()
            raise ValueError(f"{layer}.qzeros: sym is true, so every zero point must be "
                             f"{1 << (bits - 1)}, but output {n} group {g} has "
                             f"{int(zero[n, g]) + (1 << (bits - 1))}")
        zero = None
    perm = None
    if g_idx is not None:
        perm = _act_order(layer, g_idx, K, gs, desc_act)
        if perm is not None:
            q = q[:, perm]
    return QuantizedWeight(q.contiguous(), scales.t().contiguous(), zero, bits, gs,
                           perm).check(layer)


def _act_order(layer: str, g_idx: torch.Tensor, K: int, gs: int, desc_act: bool
               ) -> torch.Tensor | None:
    """The column order that makes groups contiguous (None if they already are), after checking
    that ``g_idx`` gives every group exactly ``gs`` inputs."""
    G = K // gs
    if tuple(g_idx.shape) != (K,):
        raise ValueError(f"{layer}.g_idx has shape {tuple(g_idx.shape)} for a qweight of {K} "
                         f"inputs; it needs ({K},)")
    g = g_idx.to(torch.int64)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= G):
        raise ValueError(f"{layer}.g_idx names groups {int(g.min())}..{int(g.max())}; scales "
                         f"hold {G} (0..{G - 1})")
    if torch.equal(g, torch.arange(K) // gs):
        return None
    if not desc_act:
        raise ValueError(f"{layer}.g_idx orders the inputs out of sequence, but "
                         f"quantization_config.desc_act is false: readers disagree on which "
                         f"to trust, so nanoserve trusts neither")
    counts = torch.bincount(g, minlength=G)
    if bool((counts != gs).any()):
        bad = int((counts != gs).nonzero()[0])
        raise ValueError(f"{layer}.g_idx puts {int(counts[bad])} inputs in group {bad}; every "
                         f"group of group_size {gs} needs exactly {gs}")
    return torch.sort(g, stable=True).indices  # (K,) int64
