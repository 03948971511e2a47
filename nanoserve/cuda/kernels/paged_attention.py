"""The paged-attention kernel: K/V read through the block table, softmax kept online.

Why this module exists: ``paged_attention_batched_reference`` gathers a (B, S) cell rectangle,
a (B, Hkv, S, D) copy of K and of V and a (B, Hq, 1, S) score rectangle before it masks, S being
the longest row (Day 58 names it as the debt Week 14 pays). This kernel builds none of them. One
program per (query row, KV head) walks its own row's context in tiles of ``BLOCK_N`` tokens (one
or more blocks); each token's cell is ``block_table[row, p // block_size] * block_size +
p % block_size``, computed in int64 because a block id times the pool's block stride passes 2^31
elements in a large pool. The GQA query heads that share the KV head are packed into the rows of
one tile (padded to 16, the smallest ``tl.dot``), so K/V are read once per KV head, not once per
query head. Scores, running max, running sum and the output accumulate in float32.

Split-K (flash decoding): a long context with few rows leaves most of the GPU idle, so the
context is cut into segments, each program writes a partial output and its log-sum-exp, and
``_combine_kernel`` merges them. ``choose_splits`` picks the path from the batch *shape* only
(query rows, KV heads, the block table's width), never from the context lengths, so a captured
graph, whose block table is its fixed-width buffer, replays the path it recorded.

Prefill: a row with T > 1 query tokens is T query rows sharing one block table, each with its own
causal horizon ``min(position + 1, context_len)``: correct, and tested, but each query token
re-reads the context, so the engine's prompts keep going through ``packed_prefill_attention``
(fresh K/V, no pool read) and the kernel serves decode.

Sliding window (``window``, a layer's own): a query at position i sees keys i - window < j <= i,
so a program's first token is ``horizon - window`` (the horizon being the context length, or
position + 1 with ``q_positions``). Its tiles start at the block holding that token, the tokens
before it in that first block are masked, and no block wholly before it is read, not even its
table entry: such a block may already be back in the pool. A split-K segment wholly before the
window runs no tile and leaves a log-sum-exp of -inf and a zero output, which the combine
weighs 0.

Worked example (block_size 4, row 0 holds blocks [7, 2], context 6)::

    position  0  1  2  3 | 4  5
    cell     28 29 30 31 | 8  9      # 7*4 + 0..3, then 2*4 + 0..1
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_DOT = 16  # tl.dot needs >= 16 along every dimension on a GPU
MIN_PROGRAMS = 264  # two programs per SM of an H200 (132 SMs): below this, long contexts split
SEGMENT_TOKENS = 256  # the shortest segment a split program is given
MAX_SPLITS = 32
LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, pos_ptr, out_ptr, lse_ptr,
        sm_scale, T, seg_len, window,
        stride_qb, stride_qh, stride_qt,
        stride_kc, stride_kh, stride_vc, stride_vh,
        stride_btb, stride_pb, stride_pt,
        stride_ob, stride_oh, stride_ot, stride_os,
        stride_lb, stride_lh, stride_lt,
        BLOCK_SIZE: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
        D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_POS: tl.constexpr,
        HAS_WINDOW: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid (B*T, Hkv, splits). Writes out (B, Hq, T, D) or, split, partials and LSEs."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    length = tl.load(ctx_ptr + b).to(tl.int32)
    if HAS_POS:  # causal horizon of this query token
        length = tl.minimum(length, tl.load(pos_ptr + b * stride_pb + t * stride_pt).to(tl.int32)
                            + 1)
    lo = 0
    hi = length
    if SPLIT:
        lo = seg * seg_len
        hi = tl.minimum(length, lo + seg_len)
    first = 0  # the first position this query sees
    if HAS_WINDOW:
        first = tl.maximum(length - window, 0)
        # from the block that holds it; a segment wholly before it runs no tile at all (a tile
        # of masked tokens only would rescale by exp2(-inf - -inf), a NaN)
        lo = tl.where(hi <= first, hi, tl.maximum(lo, first // BLOCK_SIZE * BLOCK_SIZE))
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < G
    d_ok = d < D
    heads = kvh * G + g  # (G_PAD,) the query heads of this KV head
    q = tl.load(q_ptr + b * stride_qb + t * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # (G_PAD, D_PAD)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tok = start + n  # (BLOCK_N,) context positions
        tok_ok = (tok < hi) & (tok >= first)  # masked tokens read no table entry, no cell
        blk = tl.load(bt_ptr + b * stride_btb + tok // BLOCK_SIZE, mask=tok_ok, other=0)
        cell = blk.to(tl.int64) * BLOCK_SIZE + tok % BLOCK_SIZE  # (BLOCK_N,) int64
        kv_ok = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + cell[:, None] * stride_kc + kvh * stride_kh + d[None, :],
                    mask=kv_ok, other=0.0)  # (BLOCK_N, D_PAD)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale  # (G_PAD, BLOCK_N)
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # (G_PAD, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + cell[:, None] * stride_vc + kvh * stride_vh + d[None, :],
                    mask=kv_ok, other=0.0)  # (BLOCK_N, D_PAD)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]  # (G_PAD, D_PAD)
    offs = b * stride_ob + heads[:, None] * stride_oh + t * stride_ot + seg * stride_os + d[None, :]
    out_ok = g_ok[:, None] & d_ok[None, :]
    if SPLIT:
        tl.store(out_ptr + offs, o, mask=out_ok)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))  # base 2
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + t * stride_lt + seg, lse,
                 mask=g_ok)
    else:
        tl.store(out_ptr + offs, o.to(out_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, out_ptr, num_splits, Hq, T,
                    stride_pr, stride_ps, stride_lr, stride_ob, stride_oh, stride_ot,
                    D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr):
    """Grid (B*Hq*T,): merge one query head's segments by their log-sum-exps."""
    r = tl.program_id(0).to(tl.int64)  # flat (b, h, t)
    b = r // (Hq * T)
    h = (r // T) % Hq
    t = r % T
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    s_ok = s < num_splits
    d_ok = d < D
    lse = tl.load(lse_ptr + r * stride_lr + s, mask=s_ok, other=float("-inf"))  # (S_PAD,)
    w = tl.where(s_ok, tl.exp2(lse - tl.max(lse, 0)), 0.0)
    o = tl.load(part_ptr + r * stride_pr + s[:, None] * stride_ps + d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # (S_PAD, D_PAD)
    res = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # (D_PAD,)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + t * stride_ot + d,
             res.to(out_ptr.dtype.element_ty), mask=d_ok)


def tile_tokens(block_size: int, tile: int = 64) -> int:
    """Tokens per tile: a power of two, at least 16 and at least one block."""
    return triton.next_power_of_2(max(MIN_DOT, tile, block_size))


def choose_splits(query_rows: int, num_kv_heads: int, max_tokens: int,
                  block_n: int, splits: int | None = None) -> tuple[int, int]:
    """(segments, tokens per segment) for a batch shape; (1, 0) is the one-pass path.

    Deterministic in the shape: ``max_tokens`` is the block table's width times the block size,
    not a context length, so the same shape always takes the same path. Chosen segments are whole
    tiles; ``splits`` forces a count (1: one pass; at most MAX_SPLITS, which is also the combine
    kernel's fixed width) with segments of any length.

    >>> choose_splits(1, 8, 4096, 64)  # 8 programs for 264 slots: 16 segments of 256 tokens
    (16, 256)
    >>> choose_splits(64, 8, 4096, 64)  # 512 programs already fill the card
    (1, 0)
    """
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


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                    q_positions: torch.Tensor | None = None, splits: int | None = None,
                    tile: int = 64, window: int | None = None) -> torch.Tensor:
    """Attention for B rows over their paged contexts, read through their block ids.

    q            (B, Hq, T, D)   queries of the new tokens
    k_pool       (cells, Hkv, D) one layer's pool, cell = block * block_size + offset; v likewise
    block_tables (B, W)          block ids of each row, in order (entries past a row's end unread)
    context_lens (B,)            tokens in each row's context
    q_positions  (B, T)          absolute position of each query; None: each sees its whole row
    splits       None: ``choose_splits`` decides; 1 forces one pass, n > 1 forces split-K
    window       a query at position i sees keys i - window < j <= i only (None: all j <= i)
    returns      (B, Hq, T, D) in q's dtype
    """
    B, Hq, T, D = q.shape
    Hkv = k_pool.shape[-2]
    k_pool, v_pool = k_pool.reshape(-1, Hkv, D), v_pool.reshape(-1, Hkv, D)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("the K/V pools must be contiguous along head_dim")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not share {Hkv} KV heads evenly")
    G = Hq // Hkv
    block_n = tile_tokens(block_size, tile)
    S, seg = choose_splits(B * T, Hkv, block_tables.shape[1] * block_size, block_n, splits)
    out = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)  # (B, Hq, T, D)
    if S > 1:
        part = torch.empty(B, Hq, T, S, D, dtype=torch.float32, device=q.device)  # partials
        lse = torch.empty(B, Hq, T, S, dtype=torch.float32, device=q.device)
        dst, lse_strides = part, lse.stride()[:3]
    else:
        part = lse = None
        dst, lse_strides = out, (0, 0, 0)
    pos = q_positions if q_positions is not None else context_lens  # a placeholder when unused
    pos_strides = q_positions.stride() if q_positions is not None else (0, 0)
    o_strides = (*dst.stride()[:3], dst.stride(3) if S > 1 else 0)
    _paged_attention_kernel[(B * T, Hkv, S)](
        q, k_pool, v_pool, block_tables, context_lens, pos, dst, lse if S > 1 else dst,
        D ** -0.5 * LOG2E, T, seg, window or 0,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        block_tables.stride(0), *pos_strides, *o_strides, *lse_strides,
        BLOCK_SIZE=block_size, G=G, G_PAD=max(MIN_DOT, triton.next_power_of_2(G)), D=D,
        D_PAD=max(MIN_DOT, triton.next_power_of_2(D)), BLOCK_N=block_n,
        HAS_POS=q_positions is not None, HAS_WINDOW=window is not None, SPLIT=S > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    if S > 1:
        _combine_kernel[(B * Hq * T,)](
            part, lse, out, S, Hq, T, part.stride(2), part.stride(3), lse.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            D=D, D_PAD=triton.next_power_of_2(D), S_PAD=MAX_SPLITS)
    return out


def paged_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           read_cells: torch.Tensor, q_positions: torch.Tensor,
                           context_lens: torch.Tensor, block_size: int = 1,
                           splits: int | None = None,
                           window: int | None = None) -> torch.Tensor:
    """``paged_attention_batched_reference``'s signature over the kernel.

    The block ids are the cells at each block's first position divided by the block size; with
    the default ``block_size=1`` every cell is its own block, which is right for any layout."""
    blocks = read_cells[:, ::block_size].clamp(min=0) // block_size  # (B, ceil(S / bs))
    return paged_attention(q, k_pool, v_pool, blocks, context_lens, block_size, q_positions,
                           splits, window=window)


def workspace_bytes(rows: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    max_blocks: int, block_size: int, query_tokens: int = 1,
                    splits: int | None = None, tile: int = 64) -> int:
    """Bytes the kernel path materialises besides its output, for one layer's read.

    The (rows, max_blocks) int64 block-id table, and on the split-K path the float32 partial
    outputs (rows*T, Hq, S, D) and log-sum-exps (rows*T, Hq, S). The one-pass path keeps its
    scores in registers: nothing else.

    >>> workspace_bytes(1, 8, 2, 64, 256, 16)  # 2 programs: 16 segments of 256 tokens
    35328
    """
    R, block_n = rows * query_tokens, tile_tokens(block_size, tile)
    S, _ = choose_splits(R, num_kv_heads, max_blocks * block_size, block_n, splits)
    table = rows * max_blocks * 8
    return table if S == 1 else table + R * num_q_heads * S * (head_dim + 1) * 4


__all__ = ["choose_splits", "paged_attention", "paged_attention_triton", "workspace_bytes"]
