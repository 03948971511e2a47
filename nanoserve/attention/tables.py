"""Where a paged sequence's tokens live: its block ids on the host, its cells on the device.

Why this module exists: with paging, a sequence's tokens live in whatever blocks the scheduler's KV
manager handed it, scattered through a shared pool. Two tables keep track of where:

- ``BlockTable`` (host): one sequence's block ids, in order. Token ``p`` lives in block
  ``blocks[p // block_size]`` at offset ``p % block_size``.
- ``SlotTable`` (device): for each batch row, the pool *cell* of every token position,
  ``cell = block * block_size + offset``. Attention reads K/V through it; it is the table the
  device needs, precomputed so a step does no per-token host work.

>>> t = BlockTable(block_size=4, capacity=2); t.extend([7, 2]); t.cells(3, 6)
[31, 8, 9]
"""

from __future__ import annotations

import torch


class BlockTable:
    """One sequence's block ids. Refuses to grow past ``capacity`` blocks."""

    def __init__(self, block_size: int, capacity: int):
        self.block_size = block_size
        self.capacity = capacity
        self.blocks: list[int] = []

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def num_slots(self) -> int:
        """Tokens the table can address."""
        return len(self.blocks) * self.block_size

    def append(self, block: int) -> None:
        self.extend([block])

    def extend(self, blocks: list[int]) -> None:
        if len(self.blocks) + len(blocks) > self.capacity:
            raise ValueError(f"BlockTable holds at most {self.capacity} blocks "
                             f"({self.capacity * self.block_size} tokens); it has "
                             f"{len(self.blocks)} and was given {len(blocks)} more")
        self.blocks.extend(blocks)

    def cells(self, start: int, end: int) -> list[int]:
        """Pool cells of token positions start..end-1."""
        if end > self.num_slots:
            raise ValueError(f"positions up to {end - 1} need {-(-end // self.block_size)} "
                             f"blocks; the table has {len(self.blocks)}")
        bs = self.block_size
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, end)]

    def clear(self) -> list[int]:
        blocks, self.blocks = self.blocks, []
        return blocks


class SlotTable:
    """(rows, max_model_len) int64 on the device: the cell of each row's token positions."""

    def __init__(self, rows: int, max_model_len: int, device: torch.device | str = "cpu"):
        self.cells = torch.full((rows, max_model_len), -1, dtype=torch.long, device=device)

    def write(self, row: int, start: int, cells: list[int]) -> None:
        self.cells[row, start:start + len(cells)] = torch.tensor(cells, dtype=torch.long)

    def reset_row(self, row: int) -> None:
        self.cells[row].fill_(-1)

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cells of row ``src`` into row ``dst`` and empty ``src``:
        one row copy inside this buffer, so an address a recorded window holds stays valid.
        Refuses a ``dst`` that still addresses anything: the plan saw another occupancy."""
        if src == dst:
            raise ValueError(f"row {src} cannot move onto itself")
        if bool((self.cells[dst] != -1).any()):
            raise ValueError(f"row {dst} is not empty; moving row {src} there would overwrite "
                             f"another request's addressing")
        self.cells[dst, :length] = self.cells[src, :length]
        self.cells[src].fill_(-1)
