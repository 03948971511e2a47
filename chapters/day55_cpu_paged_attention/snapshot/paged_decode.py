"""Day 55 snapshot (frozen): the C++ CPU decode-attention kernel's algorithm, in plain torch.

``decode_attention.cpp`` (beside this file, a frozen copy of ``nanoserve/csrc``'s source) reads
K and V where they lie in the paged pools. This module does the same work, in the same order,
as Python loops over the kernel's tasks, so the algorithm can be read top to bottom and held
against the compiled op:

- a *task* is (row, KV head, split): the row's context is cut into splits of ``K_SPLIT`` = 512
  tokens, so one long row is still several tasks, and ``at::parallel_for`` spreads the tasks
  over the cores;
- token ``t`` of row ``b`` lives in cell ``blocks[t // bs] * bs + t % bs`` of the pool, its KV
  head ``h`` a contiguous D-vector there; nothing is gathered, no (B, S) tensor exists;
- the G = Hq / Hkv query heads that share the KV head are scored together: each K vector is
  fetched once and dotted with all G queries;
- tokens are scored ``K_TILE`` = 16 at a time, then an online-softmax update: a running max
  ``m``, a running sum ``l`` and an accumulator ``acc`` (G x D), the old sum and accumulator
  rescaled by ``exp(m_old - m_new)``. Everything is float32 whatever the pools' dtype (natural
  ``exp``, as ``std::exp`` in the C++);
- a split leaves ``(m, l, acc)`` unnormalised; the combine weighs each split by
  ``exp(m_s - M)``, M the row's largest max, and divides once at the end.

Worked example: a row holding blocks [7, 2] of 4 tokens, context 6, reads cells::

    >>> cells_of([7, 2], 6, 4)
    [28, 29, 30, 31, 8, 9]

and 8 rows, the longest 2,000 tokens, over 3 KV heads make 8 x 3 x 4 tasks::

    >>> task_grid(8, 3, [2000, 10, 10, 10, 10, 10, 10, 10])
    (8, 3, 4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

K_SPLIT = 512  # tokens per split (kSplit in the C++)
K_TILE = 16  # tokens scored before one online-softmax update (kTile)


@dataclass(slots=True)
class Counts:
    """What one call did: tasks that ran (empty splits are skipped), tiles scored, K vectors
    fetched from the pool (each one used by all G query heads of its group)."""

    tasks: int = 0
    tiles: int = 0
    k_rows: int = 0


def cells_of(blocks: list[int], length: int, block_size: int) -> list[int]:
    """The pool cells of a row's first ``length`` tokens, read through its block ids."""
    return [blocks[t // block_size] * block_size + t % block_size for t in range(length)]


def num_splits(context_lens: list[int]) -> int:
    """Splits per (row, KV head): the batch's longest row decides, for every row."""
    return max(-(-int(n) // K_SPLIT) for n in context_lens)


def task_grid(rows: int, num_kv_heads: int, context_lens: list[int]) -> tuple[int, int, int]:
    """(rows, KV heads, splits): the kernel's parallel loop runs over their product."""
    return rows, num_kv_heads, num_splits(context_lens)


def workspace_bytes(context_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, block_size: int) -> int:
    """Bytes one layer's decode read materialises besides its output, from the allocations:
    the (B, W) int64 block table the engine hands the kernel (``step.blocks``, W = ceil(longest
    / block_size)) and the kernel's ``std::vector<float> part(B * Hkv * splits * G * (D + 2))``:
    per task, G maxima, G sums and the G x D accumulator. (A task's own scratch, G x D scaled
    queries and G x 16 scores, lives only while that task runs.)

    >>> workspace_bytes([600, 20], 8, 2, 64, 16)  # 2 * 38 * 8 + 2 * 2 * 2 * 4 * 66 * 4
    9056
    """
    B, G = len(context_lens), num_q_heads // num_kv_heads
    W = -(-max(context_lens) // block_size)
    splits = num_splits(context_lens)
    return B * W * 8 + B * num_kv_heads * splits * G * (head_dim + 2) * 4


def attend_split(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 blocks: torch.Tensor, block_size: int, h: int, t0: int, t1: int,
                 scale: float, counts: Counts) -> tuple[torch.Tensor, ...]:
    """One task: tokens [t0, t1) of one row, KV head ``h``.

    q       (G, D)           the query heads of the group
    k_pool  (cells, Hkv, D)  v_pool likewise; read in place
    blocks  (W,) int64       the row's block ids (entries past its end are never read)
    returns m (G,), l (G,), acc (G, D), float32, acc not yet divided by l
    """
    G, D = q.shape
    qf = q.float() * scale  # the scale folded into the queries once, as the C++ does
    m = torch.full((G,), -math.inf)
    lsum = torch.zeros(G)  # the running sum (l in the C++)
    acc = torch.zeros(G, D)
    for t in range(t0, t1, K_TILE):
        p = torch.arange(t, min(t + K_TILE, t1))  # (n,) this tile's positions
        cell = blocks[p // block_size] * block_size + p % block_size  # (n,) int64
        k = k_pool[cell, h].float()  # (n, D): each K vector once, for all G heads
        s = qf @ k.T  # (G, n) float32 scores
        v = v_pool[cell, h].float()  # (n, D)
        mx = torch.maximum(m, s.amax(1))  # the new running max
        alpha = torch.exp(m - mx)  # how much the old sum and accumulator shrink (0 at first)
        w = torch.exp(s - mx[:, None])  # (G, n)
        lsum = lsum * alpha + w.sum(1)
        acc = acc * alpha[:, None] + w @ v
        m = mx
        counts.tiles += 1
        counts.k_rows += len(p)
    counts.tasks += 1
    return m, lsum, acc


def combine(m: torch.Tensor, lsum: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """m, lsum (S, G), acc (S, G, D) of one row's S used splits -> (G, D): the row's softmax-
    weighted sum of V. Each split's share is rescaled to the row's largest max."""
    M = m.amax(0)  # (G,)
    w = torch.exp(m - M)  # (S, G)
    L = (lsum * w).sum(0)  # (G,)
    return (acc * w[..., None]).sum(0) / L[:, None]


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_table: torch.Tensor, context_lens: torch.Tensor,
                           block_size: int, scale: float,
                           counts: Counts | None = None) -> torch.Tensor:
    """q (B, Hq, D) -> (B, Hq, D) in q's dtype: what ``torch.ops.nanoserve.
    paged_decode_attention`` writes into ``out``. block_table (B, W) int64, -1 past each row's
    end; context_lens (B,). ``counts``, when given, is filled in."""
    counts = Counts() if counts is None else counts
    B, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    G = Hq // Hkv
    lens = [int(n) for n in context_lens]
    splits = num_splits(lens)
    part = torch.zeros(B * Hkv * splits, G * (D + 2))  # the C++'s `part`, one row per task
    for task in range(B * Hkv * splits):  # at::parallel_for over these, in any order
        b, h, sp = task // (Hkv * splits), task // splits % Hkv, task % splits
        t0, t1 = sp * K_SPLIT, min(lens[b], (sp + 1) * K_SPLIT)
        if t0 >= t1:  # a short row in a batch with a long one: nothing to do
            continue
        m, lsum, acc = attend_split(q[b, h * G:(h + 1) * G], k_pool, v_pool, block_table[b],
                                 block_size, h, t0, t1, scale, counts)
        part[task, :G], part[task, G:2 * G], part[task, 2 * G:] = m, lsum, acc.reshape(-1)
    out = torch.empty(B, Hq, D)
    for bh in range(B * Hkv):  # the combine: one (row, KV head) at a time
        b, h = bh // Hkv, bh % Hkv
        used = part[bh * splits:bh * splits + -(-lens[b] // K_SPLIT)]  # (S, G * (D + 2))
        out[b, h * G:(h + 1) * G] = combine(used[:, :G], used[:, G:2 * G],
                                            used[:, 2 * G:].reshape(-1, G, D))
    return out.to(q.dtype)
