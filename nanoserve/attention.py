"""Attention over the paged KV cache.

Why this module exists: once K/V live in scattered pool cells, attention has to find them.
``paged_attention_batched_reference`` is the plain way: gather each row's context through its
slot-table row into a (B, S) rectangle, S being the longest context in the batch, mask what a row
may not see, and run ordinary attention. Every later fast path (the gathered mapping, the paged
kernel) is tested against this function.

Its cost is the rectangle: a row with 10 cached tokens in a batch whose longest row has 2,000 is
gathered, and masked, at width 2,000. That is the debt the Day 50 gathered mapping pays back:
``paged_attention_gathered`` reads each row's own cells only, through the chunked index that
``gathered.GatheredIndex`` keeps on the cache. ``workspace_bytes`` prices what each path
materialises, so the two can be compared by counting rather than timing.

Packed prefill (``packed_prefill_attention``) is the prompt-side counterpart: prompts packed
into one token stream, each attending causally to itself only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_batched_reference(q: torch.Tensor, k_pool: torch.Tensor,
                                      v_pool: torch.Tensor, read_cells: torch.Tensor,
                                      q_positions: torch.Tensor,
                                      context_lens: torch.Tensor) -> torch.Tensor:
    """Attention for B rows over their paged contexts.

    q            (B, Hq, T, D)   queries of the new tokens (padding rows/columns allowed)
    k_pool       (cells, Hkv, D) one layer's pool; v_pool likewise
    read_cells   (B, S)          pool cell of each context position, -1 past the row's end
    q_positions  (B, T)          absolute position of each query (its causal horizon)
    context_lens (B,)            tokens in each row's context
    returns      (B, Hq, T, D)
    """
    S = read_cells.shape[1]
    cells = read_cells.clamp(min=0)
    keys = k_pool[cells].transpose(1, 2)  # (B, Hkv, S, D)
    values = v_pool[cells].transpose(1, 2)  # (B, Hkv, S, D)
    j = torch.arange(S, device=q.device)
    mask = (j[None, None, :] <= q_positions[:, :, None]) & \
        (j[None, None, :] < context_lens[:, None, None])  # (B, T, S)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None],
                                          enable_gqa=True)


def paged_attention_gathered(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                             cells: torch.Tensor, chunk_b: torch.Tensor) -> torch.Tensor:
    """Decode attention over the gathered mapping: each row reads only its own chunks.

    q        (B, Hq, D)      one query per row, at the row's last position
    k_pool   (cells, Hkv, D) one layer's pool; v_pool likewise
    cells    (n, C)          pool cells of the batch's contexts, C per chunk, -1 for padding
    chunk_b  (n,)            the row (0..B-1) each chunk belongs to
    returns  (B, Hq, D)

    A softmax split over chunks: each chunk's scores are a (g x C) matmul per KV head; the
    row's max is a scatter-max over its chunks, and numerator and denominator are summed per row
    with index_add. Scores, max and sums are float32 whatever the pool's dtype.
    """
    B, Hq, D = q.shape
    n, C = cells.shape
    Hkv = k_pool.shape[1]
    g = Hq // Hkv
    flat = cells.clamp(min=0).view(-1)
    # Gather rows of the pool as they lie (a strided gather is many times slower), then view
    # them head-major: (Hkv, n, C, D) with a row stride of Hkv * D, which matmul reads in place.
    keys = k_pool.index_select(0, flat).view(n, C, Hkv, D).permute(2, 0, 1, 3)
    values = v_pool.index_select(0, flat).view(n, C, Hkv, D).permute(2, 0, 1, 3)
    qc = q.view(B, Hkv, g, D).transpose(0, 1).index_select(1, chunk_b)  # (Hkv, n, g, D)
    s = torch.matmul(qc, keys.transpose(-1, -2)).float() * D ** -0.5  # (Hkv, n, g, C)
    s = s.masked_fill((cells < 0)[None, :, None, :], float("-inf"))
    m = s.new_full((Hkv, B, g), float("-inf")).scatter_reduce_(
        1, chunk_b[None, :, None].expand(Hkv, n, g), s.amax(-1), "amax")  # (Hkv, B, g)
    p = (s - m.index_select(1, chunk_b)[..., None]).exp()  # (Hkv, n, g, C)
    den = s.new_zeros(Hkv, B, g).index_add_(1, chunk_b, p.sum(-1))  # (Hkv, B, g)
    pv = torch.matmul(p.to(values.dtype), values).float()  # (Hkv, n, g, D)
    out = s.new_zeros(Hkv, B, g, D).index_add_(1, chunk_b, pv) / den[..., None]
    out = out.transpose(0, 1)  # (B, Hkv, g, D)
    return out.reshape(B, Hq, D).to(q.dtype)


def packed_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             seq_lens: list[int]) -> torch.Tensor:
    """Causal attention for prompts packed into one stream, each seeing only itself.

    q (1, Hq, N, D), k/v (1, Hkv, N, D), N = sum(seq_lens); every prompt starts at position 0,
    so its keys are the fresh ones and no pool read is needed. A loop over the prompts: the work
    is sum(n^2), where a block-diagonal mask over the stream would be N^2.
    """
    out, s = torch.empty_like(q), 0
    for n in seq_lens:
        out[:, :, s:s + n] = F.scaled_dot_product_attention(
            q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], is_causal=True, enable_gqa=True)
        s += n
    return out


def workspace_bytes(path: str, context_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, dtype_bytes: int, chunk: int = 32,
                    block_size: int = 16) -> int:
    """Bytes of the intermediate tensors one layer's decode read materialises (one query/row).

    reference: the (B, S) cell rectangle (int64), keys and values gathered at (B, S, Hkv, D), the
      (B, 1, S) bool mask and the (B, Hq, 1, S) score rectangle (float32), S = max(context_lens).
    gathered: the (n, C) chunk cells (int64), keys and values at (n*C, Hkv, D), the queries
      per chunk (n, Hq, D), scores and probabilities (n, Hq, C) float32 and the per-chunk
      outputs (n, Hq, D) float32, n = sum(ceil(len / C)).
    triton: the (B, ceil(S / block_size)) int64 block ids, and only on the split-K path the
      float32 partial outputs and log-sum-exps (``nanoserve.kernels.workspace_bytes``).

    >>> workspace_bytes("reference", [4, 4], 2, 1, 8, 4)  # 64 + 512 + 8 + 64
    648
    """
    B, Hq, Hkv, D, e = len(context_lens), num_q_heads, num_kv_heads, head_dim, dtype_bytes
    if path == "reference":
        S = max(context_lens)
        return B * S * 8 + 2 * B * S * Hkv * D * e + B * S + B * Hq * S * 4
    if path == "gathered":
        n = sum(-(-c // chunk) for c in context_lens)
        return (n * chunk * 8 + 2 * n * chunk * Hkv * D * e + n * Hq * D * e
                + 2 * n * Hq * chunk * 4 + n * Hq * D * 4)
    if path == "triton":
        from .kernels.paged_attention import workspace_bytes as kernel_bytes
        return kernel_bytes(B, Hq, Hkv, D, -(-max(context_lens) // block_size), block_size)
    raise ValueError(f"path={path!r}; choose 'reference', 'gathered' or 'triton'")
