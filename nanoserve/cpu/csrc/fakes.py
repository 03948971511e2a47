"""The C++ ops' fake implementations, which ``torch.compile`` traces instead of the ops.

Why this module exists: ``torch.compile`` traces a model with fake tensors; an op it cannot
look inside needs a fake implementation that says what it does to shapes. Every op here only
writes into arguments it was given, so each fake does nothing, and the compiler keeps the op
opaque, in order. ``load()`` registers them; the ops' PyTorch references, which the runtime
never needs, are ``reference.py``, which only tests and chapters import.
"""

from __future__ import annotations

import torch


def _no_shape_change(*args, **kwargs) -> None:
    return None


OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rope_and_cache",
       "paged_decode_attention", "apply_token_bitmask", "argmax_rows", "decode_layers",
       "decode_layers_quant",
       "quant_gemm", "dequantize_into", "int8_gemm")


def _packed_shape(weight: torch.Tensor) -> torch.Tensor:
    N, K = weight.shape  # as small_gemm.cpp packs: bf16 (N/32 blocks, K/2 pairs, 32, 2),
    if weight.dtype == torch.float32:  # float32 (N/32 blocks, K, 32)
        return weight.new_empty(-(-N // 32), K, 32)
    return weight.new_empty(-(-N // 32), -(-K // 2), 32, 2)


def _quant_packed_shape(q: torch.Tensor, bits: int) -> torch.Tensor:
    N, K = q.shape  # as quant_gemm.cpp packs: int4 (N/32, K/8, 128) uint8, int8 (N/32, K, 32)
    if bits == 4:
        return q.new_empty(-(-N // 32), K // 8, 128, dtype=torch.uint8)
    return q.new_empty(-(-N // 32), K, 32)


def _int8_packed_shape(q: torch.Tensor) -> torch.Tensor:
    N, K = q.shape  # as int8_gemm.cpp packs: (N/32, (K/4, 32, 4) bytes + 32 int32 sums)
    return q.new_empty(-(-N // 32), -(-K // 4) * 128 + 128)


def register_fakes() -> None:
    """Called by ``load()`` once the library has defined the ops."""
    for name in (*OPS, "small_gemm"):
        torch.library.register_fake(f"nanoserve::{name}")(_no_shape_change)
    torch.library.register_fake("nanoserve::pack_small_gemm")(_packed_shape)
    torch.library.register_fake("nanoserve::pack_quant_weight")(_quant_packed_shape)
    torch.library.register_fake("nanoserve::pack_int8_weight")(_int8_packed_shape)
