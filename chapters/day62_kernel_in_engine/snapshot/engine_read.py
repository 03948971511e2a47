"""Day 62 snapshot (frozen): what ``attention="triton"`` changes in the engine, in plain torch.

Two decisions, both small:

- *Which step goes where.* A decode step (one new token per row) reads the paged pool through
  the kernel. A prefill step does not: every prompt starts at position 0, so its keys are the
  fresh K/V just computed and packed prefill attends over those with no pool read at all. The
  kernel, handed a prompt of n tokens, is n query rows that each re-read their causal prefix,
  1 + 2 + ... + n pool cells per KV head: ``prefix_cells_read(n)``.
- *Where the block ids come from.* The slot table already holds every cached position's cell,
  ``block * block_size + offset``; a block's id is the cell of its first position divided by the
  block size. In eager mode the table handed to the kernel is as wide as this step's longest
  row needs, so its width (and with it the split rule's input) grows as the batch decodes.

    >>> prefix_cells_read(4)
    10
"""

from __future__ import annotations

import torch


def route(num_new: list[int], starts: list[int]) -> str:
    """The attention path of one step: rows appending ``num_new`` tokens after ``starts``."""
    if max(num_new) == 1:
        return "kernel"
    if not any(starts):
        return "packed prefill"
    return "reference"  # a prompt that resumes a cached context (not produced by this engine)


def block_ids(slot_cells: torch.Tensor, rows: list[int], context_lens: list[int],
              block_size: int) -> torch.Tensor:
    """(B, ceil(max ctx / block_size)) block ids for the kernel, from the slot table's rows:
    each block's first cell // block_size, -1 past a row's end."""
    width = -(-max(context_lens) // block_size)
    return slot_cells[rows, ::block_size][:, :width] // block_size


def prefix_cells_read(n: int) -> int:
    """Pool cells the kernel reads, per KV head and layer, to prefill an n-token prompt."""
    return n * (n + 1) // 2
