"""Rotary position embeddings: the frequencies (with ``linear`` and ``llama3`` rescaling), the
per-position angles, and the rotation.

Why this module exists: RoPE is the one place where a token's position enters attention, and the
``inv_freq`` arithmetic must be Hugging Face's to the last rounding for logits to match. The model,
the C++ forward (``nanoserve.cpu.fused``) and the graph windows all compute their angles here.

Shapes: B batch, T tokens, H heads, D head_dim.
"""

from __future__ import annotations

import math

import torch

from nanoserve.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """The D/2 rotation frequencies, including ``linear`` and ``llama3`` rescaling."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    if s["rope_type"] == "linear":
        return inv_freq / s["factor"]
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the middle band blended.
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, blended, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """positions (B, T) -> cos, sin (B, 1, T, D), computed in fp32 then cast like HF does."""
    freqs = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D): rotate each (i, i + D/2) pair by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
