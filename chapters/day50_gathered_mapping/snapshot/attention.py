"""Day 50 snapshot (frozen): decode attention over the gathered mapping, and what each read costs.

``paged_attention_gathered`` reads each row's own chunks of cells (``gathered.GatheredIndex``)
instead of Day 28's (B, S) rectangle. ``workspace_bytes`` prices the intermediate tensors one
layer's decode read materialises on either path, so the two can be compared by counting.

    >>> workspace_bytes("reference", [4, 4], 2, 1, 8, 4)  # 64 + 512 + 8 + 64
    648
"""

from __future__ import annotations

import torch

PATHS = ("reference", "gathered")


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
    # Gather pool rows as they lie, then view them head-major: (Hkv, n, C, D).
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


def workspace_bytes(path: str, context_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, dtype_bytes: int, chunk: int = 32) -> int:
    """Bytes of the intermediate tensors one layer's decode read materialises (one query/row).

    reference: the (B, S) cell rectangle (int64), keys and values gathered at (B, S, Hkv, D), the
      (B, 1, S) bool mask and the (B, Hq, 1, S) score rectangle (float32), S = max(context_lens).
    gathered: the (n, C) chunk cells (int64), keys and values at (n*C, Hkv, D), the queries
      per chunk (n, Hq, D), scores and probabilities (n, Hq, C) float32 and the per-chunk
      outputs (n, Hq, D) float32, n = sum(ceil(len / C)).
    """
    B, Hq, Hkv, D, e = len(context_lens), num_q_heads, num_kv_heads, head_dim, dtype_bytes
    if path == "reference":
        S = max(context_lens)
        return B * S * 8 + 2 * B * S * Hkv * D * e + B * S + B * Hq * S * 4
    if path == "gathered":
        n = sum(-(-c // chunk) for c in context_lens)
        return (n * chunk * 8 + 2 * n * chunk * Hkv * D * e + n * Hq * D * e
                + 2 * n * Hq * chunk * 4 + n * Hq * D * 4)
    raise ValueError(f"path={path!r}; choose one of {PATHS}")
