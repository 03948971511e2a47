"""Causal attention over fresh keys: nothing read from a cache.

Why this module exists: two paths attend over keys that were computed in the same forward and
never read back from a pool. The uncached forward (Day 4) attends each query to the tokens it was
given (``causal_attention``; ``CausalAttention`` is that path as the attention context a model
runs over when it is given no cache); packed prefill (Day 51) attends each prompt of a packed
stream to itself only (``packed_prefill_attention``). Every attention backend that takes fresh
prompts whole goes through the second.

Shapes: B batch, Hq query heads, Hkv KV heads, T queries, S keys, N packed tokens, D head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     q_offset: int = 0, window: int | None = None) -> torch.Tensor:
    """q (B, Hq, T, D) at absolute positions q_offset..q_offset+T-1 over k/v (B, Hkv, S, D).

    Query i sees keys 0..q_offset+i, and with a ``window`` only those after
    q_offset+i-window. Grouped-query heads share their KV head.
    """
    T, S = q.shape[2], k.shape[2]
    if q_offset == 0 and T == S and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    j, i = torch.arange(S, device=q.device)[None, :], \
        q_offset + torch.arange(T, device=q.device)[:, None]
    mask = j <= i  # (T, S)
    if window is not None:
        mask &= j > i - window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def packed_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             seq_lens: list[int], window: int | None = None) -> torch.Tensor:
    """Causal attention for prompts packed into one stream, each seeing only itself.

    q (1, Hq, N, D), k/v (1, Hkv, N, D), N = sum(seq_lens); every prompt starts at position 0,
    so its keys are the fresh ones and no pool read is needed. A loop over the prompts: the work
    is sum(n^2), where a block-diagonal mask over the stream would be N^2. With a ``window``
    query i sees keys i - window < j <= i only (``causal_attention``).
    """
    out, s = torch.empty_like(q), 0
    for n in seq_lens:
        if window is not None:
            out[:, :, s:s + n] = causal_attention(q[:, :, s:s + n], k[:, :, s:s + n],
                                                  v[:, :, s:s + n], window=window)
            s += n
            continue
        out[:, :, s:s + n] = F.scaled_dot_product_attention(
            q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], is_causal=True, enable_gqa=True)
        s += n
    return out


class CausalAttention:
    """No cache: every query attends causally to the new tokens of its own forward (Day 4),
    through layer ``l``'s sliding window ``windows[l]`` where one is given."""

    def __init__(self, windows: tuple[int | None, ...] = ()):
        self.windows = windows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D), k/v (B, Hkv, T, D) -> (B, Hq, T, D); nothing kept."""
        return causal_attention(q, k, v, window=self.windows[layer] if self.windows else None)
