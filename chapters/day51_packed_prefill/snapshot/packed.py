"""Day 51 snapshot (frozen): packed prefill over the paged cache.

Day 27 right-padded a batch of prompts into a (B, T) rectangle, T the longest, and every padding
column went through every layer. Here the prompts are laid end to end in one (1, N) stream,
N the sum of their lengths. Each token carries its own position (counted from where its row's
cache ends) and its own pool cell, and attention is causal *within* each prompt only: a loop of
one causal attention per prompt, so the scores cost sum(n^2) where one block-diagonal mask over
the whole stream would cost N^2. Rows that already hold tokens read their cached context
through the slot table, one row at a time.

    >>> block_diagonal_mask([3, 2]).int().tolist()
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chapters.day01_llama_forward.snapshot.model import Llama
from chapters.day17_paged_kv_cache.snapshot.attention import paged_attention_batched_reference
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache


@dataclass(slots=True)
class PackedLayout:
    """One packed forward: N tokens from B prompts, prompt after prompt."""

    rows: list[int]
    seq_lens: list[int]  # (B,) new tokens per row, in stream order
    starts: list[int]  # (B,) each row's cached length before the step
    ids: torch.Tensor  # (1, N)
    positions: torch.Tensor  # (1, N) each token's position in its own sequence
    write_cells: torch.Tensor  # (N,) the pool cell each token's K/V goes to
    last: torch.Tensor  # (B,) each prompt's last token in the stream


def pack(cache: BatchedPagedKVCache, rows: list[int], prompts: list[list[int]]) -> PackedLayout:
    """Lay ``prompts[b]`` (appended to cache row ``rows[b]``) end to end; address their cells."""
    lens = [len(p) for p in prompts]
    starts = [cache.lengths[r] for r in rows]
    cells = []
    for row, start, n in zip(rows, starts, lens, strict=True):
        if start + n > cache.max_model_len:
            raise ValueError(f"row {row}: position {start + n - 1} is beyond "
                             f"max_model_len={cache.max_model_len}")
        row_cells = cache.tables[row].cells(start, start + n)  # raises if the table is short
        cache.slots.write(row, start, row_cells)
        cells += row_cells
    ids = torch.tensor([t for p in prompts for t in p])[None]  # (1, N)
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])[None]
    return PackedLayout(list(rows), lens, starts, ids, pos, torch.tensor(cells),
                        torch.tensor(lens).cumsum(0) - 1)


def block_diagonal_mask(seq_lens: list[int]) -> torch.Tensor:
    """(N, N) bool: query i sees key j iff both are in the same prompt and j <= i."""
    seq = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens))  # (N,)
    i = torch.arange(len(seq))
    return (seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None])


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     seq_lens: list[int]) -> torch.Tensor:
    """q (1, Hq, N, D), k/v (1, Hkv, N, D) -> (1, Hq, N, D): each prompt attends causally to
    itself. Every prompt starts at position 0, so its keys are the fresh ones."""
    out, s = torch.empty_like(q), 0
    for n in seq_lens:
        out[:, :, s:s + n] = F.scaled_dot_product_attention(
            q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], is_causal=True,
            enable_gqa=True)
        s += n
    return out


class PackedStep:
    """The attention backend of one packed forward: writes the stream's K/V into its cells,
    then attends per prompt. ``mask=True`` uses one block-diagonal mask instead of the loop
    (the N^2 reference the loop is held against)."""

    def __init__(self, cache: BatchedPagedKVCache, layout: PackedLayout, mask: bool = False):
        self.cache, self.layout, self.mask = cache, layout, mask

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        c, lay = self.cache, self.layout
        c.k[layer].index_copy_(0, lay.write_cells, k[0].transpose(0, 1))  # (N, Hkv, D)
        c.v[layer].index_copy_(0, lay.write_cells, v[0].transpose(0, 1))
        if any(lay.starts):  # a continuation: read each row's whole context from the pool
            out, s = torch.empty_like(q), 0
            for row, start, n in zip(lay.rows, lay.starts, lay.seq_lens, strict=True):
                ctx = torch.tensor([start + n])
                out[:, :, s:s + n] = paged_attention_batched_reference(
                    q[:, :, s:s + n], c.k[layer], c.v[layer], c.slots.cells[row:row + 1, :ctx],
                    positions[:, s:s + n], ctx)
                s += n
            return out
        if self.mask:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=block_diagonal_mask(lay.seq_lens), enable_gqa=True)
        return packed_attention(q, k, v, lay.seq_lens)


@torch.inference_mode()
def packed_prefill(model: Llama, cache: BatchedPagedKVCache, rows: list[int],
                   prompts: list[list[int]], mask: bool = False) -> torch.Tensor:
    """Append prompts[b] to cache row rows[b] in one (1, N) forward -> last-token logits (B, V)."""
    layout = pack(cache, rows, prompts)
    h = model(layout.ids, layout.positions, PackedStep(cache, layout, mask))  # (1, N, E)
    for row, n in zip(rows, layout.seq_lens, strict=True):
        cache.lengths[row] += n
    return model.compute_logits(h[0, layout.last])  # (B, V)
