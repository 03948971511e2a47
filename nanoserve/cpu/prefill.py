"""Prompts through the CPU decode kernel: each prompt token is a decode row over its prefix.

Why this module exists: a packed prefill step attends each prompt causally to itself
(``nanoserve.attention.causal.packed_prefill_attention``, one ``F.scaled_dot_product_attention``
per prompt). On a CPU, for the short prompts of a serving batch, torch's flash attention ran at
20-38 GFLOP/s (bf16, one thread, 9 query heads over 3 KV heads of 64, prompts of 32 to 192 tokens)
and took about a fifth of a bf16 prefill step's time. By the time attention runs,
``rope_and_cache`` has already written every prompt token's K and V into its pool cells, so token
``p`` of a prompt is exactly a decode row whose context is the prompt's first ``p + 1`` tokens,
read through the prompt's blocks. ``csrc/decode_attention.cpp`` then does the causal read with no
mask, no copy of K or V, and its GQA grouping: on the same shapes 1.5-1.95x SDPA's speed in bf16,
1.2-1.55x in float32 (``python -m nanoserve.bench.speedpaths prefill``, paired medians on a 2-core
AMD EPYC). Its sums run in another order than SDPA's, as the decode read's already do. A continued
chunk (a long prompt's later part under the step's token budget, or a prompt after a prefix-cache
hit) is read the same way over its row's blocks (``chunk_tables``), where the reference path
gathered the row's whole context into a rectangle.

    tables, ctx = token_tables(step.write_flat, step.packed_lens, fresh, block_size)
    out = attend_prompts(q, k_pool, v_pool, tables, ctx, block_size)   # (1, Hq, N, D)
    tables, ctx = chunk_tables(row_cells, start, n, block_size)        # a continued chunk

A layer with a sliding window passes it on (``window=``): each token, a decode row of context
``p + 1``, then reads positions ``p + 1 - window .. p`` only, and the kernel never touches a block
wholly before its window, so a continued chunk's table may name blocks that already went back
to the pool (``chunk_tables`` checks only the blocks the chunk's first token can see).
"""

from __future__ import annotations

import torch


def token_tables(cells: torch.Tensor, lens: list[int], fresh: list[bool],
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a packed stream of rows (``lens`` tokens each, ``cells`` (N,) their pool cells in
    stream order): each token's block table (N, W) int64, its prompt's blocks then -1, and its
    context (N,) int64, its position + 1. Only rows that start empty (``fresh``) are addressed
    this way; the tokens of the others get an empty table and context 1, and must not be read.
    A fresh row's cells start a block, so its blocks are every block_size-th cell's block."""
    widths = [-(-n // block_size) if f else 0 for n, f in zip(lens, fresh, strict=True)]
    N, W = len(cells), max(widths, default=0) or 1
    tables = torch.full((N, W), -1, dtype=torch.long)
    ctx = torch.ones(N, dtype=torch.long)
    s = 0
    for n, w, f in zip(lens, widths, fresh, strict=True):
        if f:
            blocks = cells[s:s + n:block_size] // block_size  # (w,)
            if len(blocks) != w or bool((cells[s:s + n:block_size] % block_size).any()):
                raise ValueError("a fresh prompt's cells must start each of its blocks")
            tables[s:s + n, :w] = blocks
            ctx[s:s + n] = torch.arange(1, n + 1)
        s += n
    return tables, ctx


def chunk_tables(row_cells: torch.Tensor, start: int, n: int, block_size: int,
                 window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A continued chunk (a prompt's later tokens, or a prompt after a prefix-cache hit): its
    ``n`` new tokens at positions ``start`` .. ``start + n - 1`` of a row whose cells by
    position are ``row_cells`` (at least ``start + n``). Each token's table is the row's
    blocks, (n, W) int64, and its context its position + 1, (n,) int64. With a ``window``
    the blocks before the first token's window are not checked: the kernel never reads them."""
    firsts = row_cells[:start + n:block_size]  # (W,) the cell of each block's first position
    seen = 0 if window is None else max(0, start + 1 - window) // block_size
    if bool((firsts[seen:] % block_size).any()):
        raise ValueError("a row's cells must start each of its blocks")
    tables = (firsts // block_size)[None].expand(n, -1).contiguous()
    return tables, torch.arange(start + 1, start + n + 1)


def attend_prompts(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                   tables: torch.Tensor, ctx: torch.Tensor, block_size: int,
                   window: int | None = None) -> torch.Tensor:
    """q (1, Hq, n, D) of fresh prompts' tokens, their K/V already in the pools (cells, Hkv, D);
    ``tables`` (n, W) and ``ctx`` (n,) from ``token_tables`` -> (1, Hq, n, D). A ``window``:
    each token sees its last ``window`` positions only."""
    qc = q[0].transpose(0, 1).contiguous()  # (n, Hq, D): each token a decode row
    out = torch.empty_like(qc)
    torch.ops.nanoserve.paged_decode_attention(out, qc, k_pool, v_pool, tables, ctx, block_size,
                                               q.shape[-1] ** -0.5, window or 0)
    return out.transpose(0, 1)[None]  # (1, Hq, n, D)
