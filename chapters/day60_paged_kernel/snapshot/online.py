"""Day 60 snapshot (frozen): the paged-attention kernel's arithmetic, in plain torch.

The Triton kernel of ``nanoserve/kernels/paged_attention.py`` runs one *program* per (query row,
KV head). This file does the same work as a Python loop over those programs, so it can be read
top to bottom and checked against both the kernel and the reference:

- the program's tile holds the G query heads that share its KV head (GQA packing), padded to
  at least 16 rows because ``tl.dot`` needs 16 along every dimension; head_dim is padded to the
  next power of two (48 -> 64), the padding lanes loaded as zeros;
- context positions are visited ``tile`` tokens at a time, and a position's pool cell is read
  through the block table: ``blocks[p // block_size] * block_size + p % block_size``, in int64;
- the softmax is *online*: a running max ``m``, a running sum ``l`` and an accumulator ``acc``,
  rescaled by ``2^(m_old - m_new)`` whenever a tile raises the max. Scores are in base 2 (the
  scale folds in log2(e)) because the GPU's ``exp2`` is the cheap one. All float32.

Nothing the size of the longest context is built: per program, one (G, tile) score tile at a
time. Worked example (block_size 4, row 0 holds blocks [7, 2], context 6)::

    >>> cells_of([7, 2], 6, 4)
    [28, 29, 30, 31, 8, 9]
"""

from __future__ import annotations

import math

import torch

MIN_DOT = 16  # the smallest tl.dot along any dimension
LOG2E = 1.4426950408889634


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def padded(n: int) -> int:
    """What a tile dimension of n becomes in the kernel: a power of two, at least 16."""
    return max(MIN_DOT, next_pow2(n))


def tile_tokens(block_size: int, tile: int = 64) -> int:
    """Tokens per tile: a power of two, at least 16 and at least one block."""
    return next_pow2(max(MIN_DOT, tile, block_size))


def cells_of(blocks: list[int], length: int, block_size: int) -> list[int]:
    """The pool cells of a row's first ``length`` positions, read through its block ids."""
    return [blocks[p // block_size] * block_size + p % block_size for p in range(length)]


def grid(rows: int, num_kv_heads: int) -> tuple[int, int, int]:
    """The one-pass launch grid: (query rows, KV heads, 1 segment)."""
    return rows, num_kv_heads, 1


def one_program(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, kv_head: int,
                blocks: torch.Tensor, lo: int, hi: int, block_size: int,
                tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One program over context positions [lo, hi) of one row and one KV head.

    q       (G, D)            the query heads that share ``kv_head``
    k_pool  (cells, Hkv, D)   v_pool likewise
    blocks  (W,) int64        the row's block ids (entries past its end are never read)
    returns (G, D) float32 output and (G,) float32 log-sum-exp in base 2 (-inf: no positions)
    """
    G, D = q.shape
    scale = D ** -0.5 * LOG2E  # base-2 scores
    qf = q.float()
    m = torch.full((G,), -math.inf)
    s_sum = torch.zeros(G)
    acc = torch.zeros(G, D)
    for start in range(lo, hi, tile):
        tok = torch.arange(start, min(start + tile, hi))  # (n,) positions of this tile
        cell = blocks[tok // block_size].long() * block_size + tok % block_size  # (n,) int64
        k = k_pool[cell, kv_head].float()  # (n, D)
        v = v_pool[cell, kv_head].float()  # (n, D)
        s = (qf @ k.T) * scale  # (G, n)
        m_new = torch.maximum(m, s.amax(1))
        alpha = torch.exp2(m - m_new)  # how much the old sums shrink: 0 on the first tile
        p = torch.exp2(s - m_new[:, None])  # (G, n)
        s_sum = s_sum * alpha + p.sum(1)
        acc = acc * alpha[:, None] + p @ v
        m = m_new
    if hi <= lo:
        return acc, torch.full((G,), -math.inf)
    return acc / s_sum[:, None], m + torch.log2(s_sum)


def paged_attention_online(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           block_size: int, tile: int = 64) -> torch.Tensor:
    """Decode attention, one program at a time: q (B, Hq, 1, D) -> (B, Hq, 1, D) in q's dtype.

    block_tables (B, W) int64 block ids; context_lens (B,) tokens per row."""
    B, Hq, _, D = q.shape
    Hkv = k_pool.shape[1]
    G = Hq // Hkv
    n = tile_tokens(block_size, tile)
    out = torch.empty(B, Hq, 1, D)
    for b in range(B):  # grid axis 0: query rows
        for h in range(Hkv):  # grid axis 1: KV heads; the G query heads ride along
            heads = slice(h * G, (h + 1) * G)
            o, _ = one_program(q[b, heads, 0], k_pool, v_pool, h, block_tables[b], 0,
                               int(context_lens[b]), block_size, n)
            out[b, heads, 0] = o
    return out.to(q.dtype)
