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
       "paged_decode_attention", "apply_token_bitmask", "argmax_rows", "decode_layers")


def _packed_shape(weight: torch.Tensor) -> torch.Tensor:
    N, K = weight.shape  # as small_gemm.cpp packs: bf16 (N/32 blocks, K/2 pairs, 32, 2),
    if weight.dtype == torch.float32:  # float32 (N/32 blocks, K, 32)
        return weight.new_empty(-(-N // 32), K, 32)
    return weight.new_empty(-(-N // 32), -(-K // 2), 32, 2)


def register_fakes() -> None:
    """Called by ``load()`` once the library has defined the ops."""
    for name in (*OPS, "small_gemm"):
        torch.library.register_fake(f"nanoserve::{name}")(_no_shape_change)
    torch.library.register_fake("nanoserve::pack_small_gemm")(_packed_shape)
