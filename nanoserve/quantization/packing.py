"""Small signed integers packed into int32 words, as compressed-tensors' ``pack-quantized``
format stores them.

Why this module exists: a 4-bit weight stored one to a byte would read twice the bytes it needs.
compressed-tensors offsets each value to unsigned (``q + 2**(bits-1)``) and packs ``32 // bits``
of them into one int32 word along a dimension, the first value in the lowest bits::

    word j = sum over i < 32 // bits of  u[j * (32 // bits) + i] << (bits * i)

Weights pack along the inputs (dim 1, ``weight_packed``), zero points along the output features
(dim 0, ``weight_zero_point``). A dimension not a multiple of ``32 // bits`` is padded with
zeros (in the unsigned form). Only widths that divide 32 (4 and 8 here) pack without a value
straddling two words, and those are the ones the kernels read.

    packed = pack_int32(q, 4)              # (N, K) int8 -> (N, ceil(K / 8)) int32
    q = unpack_int32(packed, 4, K)         # and back
"""

from __future__ import annotations

import torch

PACK_BITS = (4, 8)


def _per_word(bits: int) -> int:
    if bits not in PACK_BITS:
        raise ValueError(f"packing {bits}-bit values into int32; supported: {PACK_BITS}")
    return 32 // bits


def pack_int32(q: torch.Tensor, bits: int, dim: int = 1) -> torch.Tensor:
    """(R, C) signed int8 values -> int32 words along ``dim``."""
    per = _per_word(bits)
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"pack_int32 takes a 2-D int8 tensor, got {tuple(q.shape)} {q.dtype}")
    u = (q.to(torch.int64) + (1 << (bits - 1)))  # unsigned, in [0, 2**bits)
    if dim == 0:
        u = u.t()
    rows, cols = u.shape
    pad = -cols % per
    u = torch.nn.functional.pad(u, (0, pad)).view(rows, -1, per)  # (R, words, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = (u << shifts).sum(-1)  # < 2**32: fits int64; wrap to int32's two's complement
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.t().contiguous() if dim == 0 else words


def unpack_int32(packed: torch.Tensor, bits: int, size: int, dim: int = 1) -> torch.Tensor:
    """int32 words along ``dim`` -> ``size`` signed int8 values along it (padding dropped)."""
    per = _per_word(bits)
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"unpack_int32 takes a 2-D int32 tensor, got {tuple(packed.shape)} "
                         f"{packed.dtype}")
    words = packed.t() if dim == 0 else packed
    if words.shape[1] * per < size or (words.shape[1] - 1) * per >= size:
        raise ValueError(f"{words.shape[1]} int32 words hold {words.shape[1] * per} "
                         f"{bits}-bit values, not {size}")
    shifts = torch.arange(per, dtype=torch.int64) * bits
    u = (words.to(torch.int64)[..., None] >> shifts) & ((1 << bits) - 1)  # (R, words, per)
    q = (u.flatten(1)[:, :size] - (1 << (bits - 1))).to(torch.int8)
    return q.t().contiguous() if dim == 0 else q
