"""GPTQ and AWQ checkpoint WRITERS, for tests: the packing as each format's description states it.

Why this module exists: no library that writes GPTQ or AWQ files (AutoGPTQ, GPTQModel, AutoAWQ)
is a dependency here, so the readers (``gptq_format``, ``awq_format``) are checked against
packers written separately from them, straight from the published layout: explicit loops over
words and numpy's unsigned 32-bit arithmetic, where the readers use ``packing.unpack_int32`` on
torch tensors and the canonical signed form. The writers take the format's own numbers (unsigned
values ``u``, true zero points ``z``, ``scales``, ``g_idx``), not a ``QuantizedWeight``.

What a round trip through them proves, and what it does not: that reader and writer agree with
each other and with the description as we read it (which dimension the words run along, the
first value in the lowest bits, GPTQ's stored-minus-one zero points, AWQ's 0, 2, 4, 6, 1, 3, 5, 7
nibble order, act order's ``g_idx``), and that every value survives exactly. It does not prove
that AutoGPTQ, GPTQModel or AutoAWQ write what we read: a misreading shared by the description
and both of our functions would pass. A file written by those libraries is the only proof of
that; the hand-built words in the tests pin the bit positions as the description states them.

    u, z, s, g_idx = random_layer(64, 256, bits=4, group_size=32, sym=False, act_order=True)
    tensors = pack_gptq(u, z, s, g_idx, bits=4, checkpoint_format="gptq")
    w = reference_dequantize(u, z, s, g_idx)                  # (N, K) float32, from the formula
    hf, config = gptq_checkpoint(dense_hf, bits=4, group_size=32)  # a whole model's tensors
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from nanoserve.quantization.rtn import quantize_rtn

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column held by nibble 0, 1, ... of a word


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight")


def _input_of(name: str) -> str:
    """Which input a linear reads: q, k and v read one, gate and up another, so act order (the
    order of the input's Hessian diagonal) is the same for them."""
    for parts, shared in ((("q_proj", "k_proj", "v_proj"), "qkv"), (("gate_proj", "up_proj"),
                                                                      "gate_up")):
        for part in parts:
            if f".{part}." in name:
                return name.replace(part, shared)
    return name


def _unsigned(t: torch.Tensor, bits: int, what: str, lowest: int = 0) -> np.ndarray:
    a = t.to(torch.int64).numpy()
    if a.size and (a.min() < lowest or a.max() >= 1 << bits):
        raise ValueError(f"{what}: values {a.min()}..{a.max()} do not fit [{lowest}, "
                         f"{(1 << bits) - 1}]")
    return a.astype(np.uint32)


def _to_int32(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(words).view(np.int32).copy())


def pack_gptq(u: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
              bits: int, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """A GPTQ layer's tensors. ``u`` (N, K) unsigned values in [0, 2**bits); ``zeros`` (G, N) true
    zero points; ``scales`` (G, N); ``g_idx`` (K,). The original format stores each zero minus
    one (so a true zero of 0 cannot be written and is refused); ``gptq_v2`` stores it as is."""
    per = 32 // bits
    N, K = u.shape
    if K % per:
        raise ValueError(f"{K} inputs do not fill whole words of {per}")
    intweight = _unsigned(u, bits, "u").T  # (K, N): qweight packs down the inputs
    qweight = np.zeros((K // per, N), dtype=np.uint32)
    for row in range(K // per):  # word row `row` holds inputs row*per .. row*per + per - 1
        for j in range(per):
            qweight[row] |= intweight[row * per + j] << np.uint32(bits * j)
    offset = {"gptq": 1, "gptq_v2": 0}[checkpoint_format]
    stored = _unsigned(zeros, bits, f"{checkpoint_format} zero points", lowest=offset) - offset
    G = stored.shape[0]
    cols = -(-N // per)
    stored = np.concatenate([stored, np.zeros((G, cols * per - N), np.uint32)], axis=1)
    qzeros = np.zeros((G, cols), dtype=np.uint32)
    for col in range(cols):  # word column `col` holds outputs col*per .. col*per + per - 1
        for j in range(per):
            qzeros[:, col] |= stored[:, col * per + j] << np.uint32(bits * j)
    return {"qweight": _to_int32(qweight), "qzeros": _to_int32(qzeros),
            "scales": scales.to(torch.float16), "g_idx": g_idx.to(torch.int32)}


def pack_awq(u: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
             ) -> dict[str, torch.Tensor]:
    """An AWQ GEMM layer's tensors. ``u`` (N, K) unsigned 4-bit values; ``zeros`` (G, N) zero
    points (stored as they are); ``scales`` (G, N). Words run along the outputs, eight to a word,
    nibble ``i`` holding the word's output column ``AWQ_PACK_ORDER[i]``."""
    N, K = u.shape
    if N % 8:
        raise ValueError(f"{N} outputs do not fill whole words of 8")

    def pack(values: np.ndarray) -> torch.Tensor:  # (R, N) -> (R, N / 8)
        words = np.zeros((values.shape[0], N // 8), dtype=np.uint32)
        for col in range(N // 8):
            for i, c in enumerate(AWQ_PACK_ORDER):
                words[:, col] |= values[:, col * 8 + c] << np.uint32(4 * i)
        return _to_int32(words)

    return {"qweight": pack(_unsigned(u, 4, "u").T), "qzeros": pack(_unsigned(zeros, 4, "zeros")),
            "scales": scales.to(torch.float16)}


def reference_dequantize(u: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                         g_idx: torch.Tensor) -> torch.Tensor:
    """The formula both formats state, ``W[n, k] = (u[n, k] - z[g_idx[k], n]) * s[g_idx[k], n]``,
    in float32: (N, K)."""
    g = g_idx.to(torch.int64)
    z = zeros.to(torch.float32)[g].T  # (N, K)
    s = scales.to(torch.float32)[g].T
    return (u.to(torch.float32) - z) * s


def random_layer(N: int, K: int, bits: int, group_size: int, *, sym: bool, act_order: bool,
                 no_zero_zero: bool = False, seed: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (u (N, K), zeros (G, N), scales (G, N) float16, g_idx (K,)) in the formats' terms.
    ``sym``: every zero at 2**(bits-1). ``no_zero_zero``: no true zero of 0 (GPTQ's original
    format cannot store one). ``act_order``: inputs assigned to groups in a shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    gs = K if group_size == -1 else group_size
    G = K // gs
    u = torch.randint(0, 1 << bits, (N, K), generator=gen)
    if sym:
        zeros = torch.full((G, N), 1 << (bits - 1))
    else:
        zeros = torch.randint(int(no_zero_zero), 1 << bits, (G, N), generator=gen)
    scales = (torch.rand(G, N, generator=gen) * 0.02 + 1e-3).to(torch.float16)
    order = torch.randperm(K, generator=gen) if act_order else torch.arange(K)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[order] = (torch.arange(K) // gs).to(torch.int32)  # input order[j] is in group j // gs
    return u, zeros, scales, g_idx


def gptq_checkpoint(hf: dict[str, torch.Tensor], *, bits: int = 4, group_size: int = 128,
                    sym: bool = True, desc_act: bool = False, checkpoint_format: str = "gptq",
                    quantize: Callable[[str], bool] = _is_linear, seed: int = 0
                    ) -> tuple[dict[str, torch.Tensor], dict]:
    """A dense checkpoint's linear weights (those ``quantize`` picks: ``*_proj.weight`` by
    default) rounded to nearest and written as GPTQ; everything else kept. Returns the tensors
    and the ``quantization_config``. ``desc_act``: each layer's inputs grouped in a random order,
    as act order would. Scales are float16, as GPTQ stores them."""
    gen = torch.Generator().manual_seed(seed)
    out, orders = {}, {}
    for name, w in hf.items():
        if not quantize(name):
            out[name] = w
            continue
        N, K = w.shape
        gs = K if group_size == -1 else group_size
        order = torch.arange(K)
        if desc_act:  # layers that read one input (q, k, v; gate, up) share its order
            key = _input_of(name)
            if key not in orders:
                orders[key] = torch.randperm(K, generator=gen)
            order = orders[key]
        qw = quantize_rtn(w[:, order], bits, gs, sym, scale_dtype=torch.float16)
        half = 1 << (bits - 1)
        u = torch.empty(N, K, dtype=torch.int64)
        u[:, order] = qw.q.to(torch.int64) + half
        zeros = torch.full((qw.groups, N), half) if sym else qw.zero.T.to(torch.int64) + half
        g_idx = torch.empty(K, dtype=torch.int32)
        g_idx[order] = (torch.arange(K) // gs).to(torch.int32)
        layer = name[:-len(".weight")]
        for suffix, t in pack_gptq(u, zeros, qw.scale.T, g_idx, bits,
                                   checkpoint_format).items():
            out[f"{layer}.{suffix}"] = t
    config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym,
              "desc_act": desc_act, "checkpoint_format": checkpoint_format}
    return out, config


def awq_checkpoint(hf: dict[str, torch.Tensor], *, group_size: int = 128,
                   quantize: Callable[[str], bool] = _is_linear
                   ) -> tuple[dict[str, torch.Tensor], dict]:
    """A dense checkpoint's linear weights rounded to nearest (asymmetric, 4 bits) and written
    as AWQ GEMM; everything else kept. Returns the tensors and the ``quantization_config``."""
    out = {}
    for name, w in hf.items():
        if not quantize(name):
            out[name] = w
            continue
        qw = quantize_rtn(w, 4, None if group_size == -1 else group_size, symmetric=False,
                          scale_dtype=torch.float16)
        layer = name[:-len(".weight")]
        for suffix, t in pack_awq(qw.q.to(torch.int64) + 8, qw.zero.T.to(torch.int64) + 8,
                                  qw.scale.T).items():
            out[f"{layer}.{suffix}"] = t
    config = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": group_size,
              "zero_point": True, "modules_to_not_convert": None}
    return out, config
