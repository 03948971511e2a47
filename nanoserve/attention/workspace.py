"""What each attention read path materialises, priced in bytes rather than timed.

Why this module exists: the read paths differ in the intermediate tensors they build before
they score a single token, and that difference can be counted exactly on any machine.
"""

from __future__ import annotations


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
      float32 partial outputs and log-sum-exps (``nanoserve.cuda.kernels.workspace_bytes``).

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
        from nanoserve.cuda.kernels.paged_attention import workspace_bytes as kernel_bytes
        return kernel_bytes(B, Hq, Hkv, D, -(-max(context_lens) // block_size), block_size)
    raise ValueError(f"path={path!r}; choose 'reference', 'gathered' or 'triton'")
