"""The C++ ops as Python sees them: fake implementations for torch.compile, and each op's
PyTorch reference beside it.

Why this module exists: ``torch.compile`` traces a model with fake tensors; an op it cannot
look inside needs a fake implementation that says what it does to shapes. Every op here only
writes into arguments it was given, so each fake does nothing, and the compiler keeps the op
opaque, in order. The references are the model's own PyTorch code, the behaviour each kernel
must reproduce (``tests/test_csrc.py`` holds them against each other).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoserve.layers.rotary import apply_rope


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


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm: normalise in float32, round, then scale by the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_reference(x, residual, weight, eps):
    """-> (norm(x + residual), x + residual): what the fused op leaves in x and residual."""
    h = residual + x
    return rms_norm_reference(h, weight, eps), h


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, H, D), cos/sin (N, D): the model's apply_rope on one token per row."""
    return apply_rope(x.transpose(0, 1), cos[None], sin[None]).transpose(0, 1)


def decode_attention_reference(q, k_pool, v_pool, block_table, context_lens, block_size):
    """q (B, Hq, D) over each row's first context_lens[b] tokens, addressed by block_table."""
    B, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        p = torch.arange(n)
        cells = block_table[b][p // block_size] * block_size + p % block_size
        keys, values = k_pool[cells].transpose(0, 1), v_pool[cells].transpose(0, 1)  # (Hkv, n, D)
        got = F.scaled_dot_product_attention(q[b].view(Hkv, Hq // Hkv, D).float(),
                                             keys.float(), values.float())
        out[b] = got.reshape(Hq, D).to(q.dtype)
    return out


def apply_token_bitmask_reference(logits: torch.Tensor, rows: torch.Tensor,
                                  words: torch.Tensor) -> torch.Tensor:
    """logits (B, V) with row ``rows[i]``'s tokens whose bit in ``words[i]`` is 0 at -inf, and
    every column past ``32 * W`` too: what the op leaves in place, made here as a copy."""
    V = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32)
    ok = ((words[:, :, None] >> shifts) & 1).reshape(words.shape[0], -1).bool()  # (n, 32 W)
    ok = torch.cat([ok, ok.new_zeros(ok.shape[0], max(0, V - ok.shape[1]))], 1)[:, :V]
    out = logits.clone()
    out[rows] = out[rows].masked_fill(~ok, float("-inf"))
    return out
