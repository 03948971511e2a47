"""Each C++ CPU op's PyTorch reference: the behaviour the kernel must reproduce.

Why this module exists: every op in this folder has a plain PyTorch twin, written op for op as
the model computes it, and the tests hold the kernel to it over random shapes
(``tests/test_csrc.py``; Day 54 and 55 hold them to their chapters' frozen copies). Only tests and
chapters import this module; the engine runs the kernels, and never loads it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    """x (N, H, D), cos/sin (N, D): each (i, i + D/2) pair rotated by its token's angle, as
    ``nanoserve.layers.rotary.apply_rope`` does (``tests/test_csrc.py`` holds the two equal)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]


def decode_attention_reference(q, k_pool, v_pool, block_table, context_lens, block_size,
                               window: int = 0):
    """q (B, Hq, D) over each row's first context_lens[b] tokens, addressed by block_table;
    with ``window`` > 0 only the last ``window`` of them (positions max(0, L - window) .. L - 1),
    and the table's entries for blocks wholly before those are never read."""
    B, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        p = torch.arange(max(0, n - window) if window > 0 else 0, n)
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


def dequantize_reference(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                         group_size: int) -> torch.Tensor:
    """q (N, K) int8, scale and zero (N, K / group_size) -> W (N, K) float32:
    ``(q - zero) * scale`` group by group, what ``quant_gemm`` multiplies by."""
    w = q.float().unflatten(1, (-1, group_size))  # (N, G, gs)
    if zero is not None:
        w = w - zero.float()[..., None]
    return (w * scale.float()[..., None]).flatten(1)


def quant_gemm_reference(x, q, scale, zero, group_size, bias=None) -> torch.Tensor:
    """Dequantize, then ``F.linear`` in float32, rounded once to x's dtype."""
    w = dequantize_reference(q, scale, zero, group_size)
    b = None if bias is None else bias.float()
    return F.linear(x.float(), w, b).to(x.dtype)


def int8_gemm_reference(x, q, w_scale, bias=None) -> torch.Tensor:
    """W8A8's reference: x rounded to int8 per token (scale max|x| / 127, half to even) and
    back, then ``F.linear`` against ``q * w_scale`` in float32, rounded once to x's dtype."""
    xf = x.float()
    s = xf.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    xq = torch.round(xf / s).clamp(-128, 127) * s
    b = None if bias is None else bias.float()
    return F.linear(xq, q.float() * w_scale.float()[:, None], b).to(x.dtype)
