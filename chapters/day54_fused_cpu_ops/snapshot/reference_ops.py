"""Day 54 snapshot (frozen): what each fused CPU op computes, in PyTorch, with the op's signature.

Why this module exists: a C++ kernel is only as trustworthy as the plain code it is held
against. Each reference here is the model's own arithmetic (Day 1's RMSNorm, rotate-half RoPE,
SiLU times up), written so that the rounding points are visible: in bf16 every PyTorch op
rounds its result to bf16, and the kernels round at exactly those points and nowhere else.

``REFERENCE_OPS`` offers the same calls as ``torch.ops.nanoserve``, writing into the tensors
they are given and returning nothing, so the fused forward (``fused.py``) runs on either:

    >>> x = torch.tensor([[3.0, 4.0]]); out = torch.empty_like(x)
    >>> REFERENCE_OPS.rms_norm(out, x, torch.ones(2), 0.0); out
    tensor([[0.8485, 1.1314]])
    >>> res = torch.ones(1, 2); REFERENCE_OPS.fused_add_rms_norm(x, res, torch.ones(2), 0.0)
    >>> res, x          # residual += x, then x = norm(residual)
    (tensor([[4., 5.]]), tensor([[0.8835, 1.1043]]))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from chapters.day01_llama_forward.snapshot.model import apply_rope


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm: normalise in float32, round to x's dtype, scale by weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_reference(x, residual, weight, eps):
    """-> (norm(x + residual), x + residual): what the fused op leaves in x and residual."""
    h = residual + x  # rounded to the storage dtype, as the unfused model's residual add is
    return rms_norm_reference(h, weight, eps), h


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """(..., 2I) -> (..., I): silu of the first half (rounded), times the second half."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, H, D), cos/sin (N, D): Day 1's apply_rope on one token per row."""
    return apply_rope(x.transpose(0, 1), cos[None], sin[None]).transpose(0, 1)


class _ReferenceOps:
    """``torch.ops.nanoserve``'s four fused ops, in PyTorch: in place, returning None."""

    @staticmethod
    def rms_norm(out, x, weight, eps) -> None:  # out <- norm(x)
        out.copy_(rms_norm_reference(x, weight, eps))

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps) -> None:  # residual += x; x <- norm(res)
        normed, summed = fused_add_rms_norm_reference(x, residual, weight, eps)
        residual.copy_(summed)
        x.copy_(normed)

    @staticmethod
    def silu_and_mul(out, x) -> None:  # out (N, I) <- silu(x[:, :I]) * x[:, I:]
        out.copy_(silu_and_mul_reference(x))

    @staticmethod
    def rope_and_cache(q, k, v, cos, sin, k_pool, v_pool, cells) -> None:
        """Rotate q (N, Hq, D) and k (N, Hkv, D) in place; write k, v to pool rows ``cells``
        (N,), skipping cells < 0 (padding)."""
        q.copy_(rope_reference(q, cos, sin))
        k.copy_(rope_reference(k, cos, sin))
        live = cells >= 0
        if live.any():
            k_pool[cells[live]] = k[live]
            v_pool[cells[live]] = v[live]


REFERENCE_OPS = _ReferenceOps()
