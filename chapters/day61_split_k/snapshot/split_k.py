"""Day 61 snapshot (frozen): split-K (flash decoding) in plain torch, and the rule that picks it.

One program per (row, KV head) is 64 programs for 8 rows of Llama-3.2-1B's attention, on a card
with 132 SMs. With few rows and long contexts most of the card idles while each program walks
thousands of tokens. Split-K cuts each row's context into ``n`` segments of ``seg`` tokens, runs
one program per (row, KV head, segment), and merges: each segment leaves its normalised partial
output ``o_s`` and its log-sum-exp ``lse_s`` (base 2), and

    out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M),    M = max_s lse_s

which is exactly the softmax over the whole row: ``2^lse_s`` is segment s's share of the
denominator. An empty segment (the row ends before it starts) has lse = -inf and weight 0.

The rule (``choose_splits``) looks at the batch *shape* only (query rows, KV heads, the block
table's width in tokens), never at a context length, so one shape always takes one path:

    >>> choose_splits(1, 8, 4096, 64)   # 8 programs: 16 segments of 256 tokens
    (16, 256)
    >>> choose_splits(64, 8, 1024, 64)  # 512 programs fill the card: one pass
    (1, 0)
"""

from __future__ import annotations

import math

import torch

from chapters.day60_paged_kernel.snapshot.online import one_program, tile_tokens

MIN_PROGRAMS = 264  # two programs per SM of an H200 (132 SMs)
SEGMENT_TOKENS = 256  # the shortest segment the rule hands out
MAX_SPLITS = 32  # also the merge kernel's fixed width


def choose_splits(query_rows: int, num_kv_heads: int, max_tokens: int, block_n: int,
                  splits: int | None = None) -> tuple[int, int]:
    """(segments, tokens per segment); (1, 0) is the one-pass path. ``max_tokens`` is the block
    table's width times the block size. Chosen segments are whole tiles of ``block_n``;
    ``splits`` forces a count (segments of any length)."""
    forced = splits is not None
    if not forced:
        programs = query_rows * num_kv_heads
        if programs >= MIN_PROGRAMS:
            return 1, 0
        splits = min(MAX_SPLITS, -(-MIN_PROGRAMS // programs), max_tokens // SEGMENT_TOKENS)
    splits = min(splits, MAX_SPLITS)
    if splits <= 1:
        return 1, 0
    seg = -(-max_tokens // splits)
    if not forced:
        seg = -(-seg // block_n) * block_n
    n = -(-max_tokens // seg)
    return (n, seg) if n > 1 else (1, 0)


def merge(partials: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """partials (S, G, D), lse (S, G) base 2 -> (G, D): the whole row's softmax-weighted sum."""
    top = lse.amax(0)  # (G,)
    w = torch.exp2(lse - top)  # (S, G); 0 for an empty segment
    return (w[..., None] * partials).sum(0) / w.sum(0)[:, None]


def split_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    splits: int, tile: int = 64) -> tuple[torch.Tensor, torch.Tensor,
                                                           torch.Tensor]:
    """q (B, Hq, 1, D) -> (out (B, Hq, 1, D), partials (B, Hq, S, D), lse (B, Hq, S)).

    Segments cover the block table's width (``splits`` forced, as the kernel's ``splits=``)."""
    B, Hq, _, D = q.shape
    Hkv = k_pool.shape[1]
    G = Hq // Hkv
    n, seg = choose_splits(B, Hkv, block_tables.shape[1] * block_size,
                           tile_tokens(block_size, tile), splits)
    seg = seg or block_tables.shape[1] * block_size
    part = torch.zeros(B, Hq, n, D)
    lse = torch.full((B, Hq, n), -math.inf)
    for b in range(B):
        length = int(context_lens[b])
        for h in range(Hkv):
            heads = slice(h * G, (h + 1) * G)
            for s in range(n):  # grid axis 2: the segment
                lo, hi = s * seg, min(length, (s + 1) * seg)
                o, e = one_program(q[b, heads, 0], k_pool, v_pool, h, block_tables[b], lo, hi,
                                   block_size, tile_tokens(block_size, tile))
                part[b, heads, s], lse[b, heads, s] = o, e
    out = torch.stack([torch.stack([merge(part[b, h:h + 1].transpose(0, 1),
                                          lse[b, h:h + 1].transpose(0, 1))[0]
                                    for h in range(Hq)]) for b in range(B)])  # (B, Hq, D)
    return out[:, :, None].to(q.dtype), part, lse
