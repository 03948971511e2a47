"""The contiguous KV cache of the early days: one max-length rectangle per sequence.

Why this module exists: without a cache, generating token t recomputes keys and values for all t
previous tokens, so a reply of N tokens costs O(N^2) token-forwards. The cache keeps every layer's
K and V, so each step computes one new token and reads the rest. This is the simple version: it
reserves ``max_len`` positions up front, whether the sequence uses them or not. That reservation
is the waste Day 14's paged allocator removes.

>>> import torch
>>> cache = KVCache(num_layers=1, batch=1, num_kv_heads=2, head_dim=4, max_len=8)
>>> cache.k.shape
torch.Size([1, 1, 2, 8, 4])
"""

from __future__ import annotations

import torch

from nanoserve.attention.causal import causal_attention


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 max_len: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)  # (L, B, Hkv, Tmax, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # tokens already cached (the same for every row)

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> KVCache:
        cfg = model.cfg
        w = model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, cfg.head_dim,
                   max_len, w.dtype, w.device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write the new k/v (B, Hkv, T, D) at ``length``, attend q over all cached tokens."""
        start, T = self.length, k.shape[2]
        if start + T > self.max_len:
            raise ValueError(f"KV cache holds max_len={self.max_len} positions; "
                             f"writing {T} at position {start} would overflow it")
        self.k[layer, :, :, start:start + T] = k
        self.v[layer, :, :, start:start + T] = v
        keys = self.k[layer, :, :, :start + T]  # (B, Hkv, S, D)
        values = self.v[layer, :, :, :start + T]
        return causal_attention(q, keys, values, q_offset=start)

    def advance(self, num_tokens: int) -> None:
        """Mark ``num_tokens`` more positions as filled (after every layer has written them)."""
        self.length += num_tokens

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
