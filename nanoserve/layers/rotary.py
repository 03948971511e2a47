"""Rotary position embeddings: the frequencies (with ``linear``, ``llama3`` and ``longrope``
rescaling), the per-position angles, and the rotation, of the whole head or of its first
``rotary_dim`` dims (a ``partial_rotary_factor``, as Phi-4-mini sets).

Why this module exists: RoPE is the one place where a token's position enters attention, and the
``inv_freq`` arithmetic must be Hugging Face's to the last rounding for logits to match. The model,
the C++ forward (``nanoserve.cpu.fused``) and the graph windows all compute their angles here.

Shapes: B batch, T tokens, H heads, D head_dim, R the rotated dims (R = D unless partial).
"""

from __future__ import annotations

import math

import torch

from nanoserve.config import ModelConfig


def rotary_dim(cfg: ModelConfig) -> int:
    """R: the dims of each head RoPE turns, ``int(head_dim * partial_rotary_factor)`` (the
    factor from ``rope_parameters``, else the top-level key, else 1), as transformers reads it."""
    params = cfg.extra.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", cfg.extra.get("partial_rotary_factor"))
    return int(cfg.head_dim * (1.0 if factor is None else factor))


def longrope_original(cfg: ModelConfig) -> int | None:
    """The pretraining length a ``longrope`` model switches factors at: the top-level
    ``original_max_position_embeddings`` wins over ``rope_scaling``'s (transformers' rule)."""
    s = cfg.rope_scaling or {}
    return cfg.extra.get("original_max_position_embeddings") or \
        s.get("original_max_position_embeddings")


def rope_attention_factor(cfg: ModelConfig) -> float:
    """What cos and sin are multiplied by: 1, except under ``longrope``: its
    ``attention_factor``, else sqrt(1 + ln(factor) / ln(original)) where factor (the scaling's
    own, else max_position_embeddings / original) exceeds 1."""
    s = cfg.rope_scaling
    if s is None or s["rope_type"] != "longrope":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    original = longrope_original(cfg)
    factor = s.get("factor") or cfg.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_inv_freq(cfg: ModelConfig, long: bool = False) -> torch.Tensor:
    """The R/2 rotation frequencies, including ``linear``, ``llama3`` and ``longrope``
    rescaling; ``long`` picks longrope's ``long_factor`` list over its ``short_factor``."""
    d = rotary_dim(cfg)
    exponent = torch.arange(0, d, 2, dtype=torch.int64).float() / d  # (R/2,)
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] == "longrope":  # each frequency divided by its factor
        factors = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * cfg.rope_theta ** exponent)
    inv_freq = 1.0 / (cfg.rope_theta ** exponent)
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


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype,
                 scale: float = 1.0):
    """positions (B, T) -> cos, sin (B, 1, T, R), computed in fp32 (times ``scale``, longrope's
    attention factor) then cast like HF does."""
    freqs = positions.float()[..., None] * inv_freq  # (B, T, R/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, R)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D): rotate each (i, i + R/2) pair of the first R = cos.shape[-1] dims by its
    position's angle; dims R.. pass through unturned."""
    r = cos.shape[-1]
    if r < x.shape[-1]:  # partial rotary: turn the first R dims, keep the rest
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
