"""The paged KV cache: block tables on the host, slot tables on the device, one pool per layer.

Why this module exists: with paging, a sequence's tokens live in whatever blocks the allocator
handed it, scattered through a shared pool. Three objects keep track of where:

- ``BlockTable`` (host): one sequence's block ids, in order. Token ``p`` lives in block
  ``blocks[p // block_size]`` at offset ``p % block_size``.
- ``SlotTable`` (device): for each batch row, the pool *cell* of every token position,
  ``cell = block * block_size + offset``. Attention reads K/V through it; it is the table the
  device needs, precomputed so a step does no per-token host work.
- ``BatchedPagedKVCache``: rows = batch slots. It owns the K/V pools (one per layer), a
  BlockTable and a SlotTable row per slot, and each row's cached length. It is an attention
  backend: ``begin_step`` says which rows take how many new tokens, then the model's forward
  writes K/V into their cells and reads each row's context back.

Pools are flat over cells: ``k[layer]`` is (num_blocks * block_size, Hkv, D).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import paged_attention_batched_reference


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


@dataclass(slots=True)
class StepLayout:
    """Where one forward's tokens go and what each row reads. B rows, T new tokens (padded)."""

    rows: list[int]
    write_cells: torch.Tensor  # (B, T) pool cell per new token; -1 for padding
    read_cells: torch.Tensor  # (B, S) pool cell per context position; S = longest context
    context_lens: torch.Tensor  # (B,) tokens each row attends to after this step
    grows: list[bool]  # False for a held row: its length stays where it is


class BatchedPagedKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_model_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        cells = num_blocks * block_size
        self.k = torch.zeros(num_layers, cells, num_kv_heads, head_dim, dtype=dtype,
                             device=device)  # (L, cells, Hkv, D)
        self.v = torch.zeros_like(self.k)
        self.block_size = block_size
        self.max_model_len = max_model_len
        capacity = -(-max_model_len // block_size)
        self.tables = [BlockTable(block_size, capacity) for _ in range(max_num_seqs)]
        self.slots = SlotTable(max_num_seqs, max_model_len, device)
        self.lengths = [0] * max_num_seqs  # tokens cached per row
        self.device = torch.device(device)
        self._step: StepLayout | None = None

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, max_num_seqs: int,
                  max_model_len: int) -> BatchedPagedKVCache:
        cfg, w = model.cfg, model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, num_blocks,
                   block_size, max_num_seqs, max_model_len, w.dtype, w.device)

    def reset_row(self, row: int) -> list[int]:
        """Forget a row: its length, its addressing; returns its blocks for the allocator."""
        self.lengths[row] = 0
        self.slots.reset_row(row)
        return self.tables[row].clear()

    def begin_step(self, rows: list[int], num_new: list[int],
                   hold: frozenset[int] = frozenset()) -> StepLayout:
        """Rows ``rows[b]`` will append ``num_new[b]`` tokens in the next forward.

        A row in ``hold`` writes its one token at its current length without growing (a static
        batch's finished row, recomputed in place until its wave ends)."""
        if not rows or len(set(rows)) != len(rows) or len(rows) != len(num_new):
            raise ValueError(f"a step needs distinct rows, one count each: {rows}, {num_new}")
        if min(num_new) < 1:
            raise ValueError(f"every row in a step must take at least one token: {num_new}")
        B, T = len(rows), max(num_new)
        write = torch.full((B, T), -1, dtype=torch.long)
        for b, (row, n) in enumerate(zip(rows, num_new, strict=True)):
            start = self.lengths[row]
            if start + n > self.max_model_len:
                raise ValueError(f"row {row}: position {start + n - 1} is beyond "
                                 f"max_model_len={self.max_model_len}")
            cells = self.tables[row].cells(start, start + n)
            self.slots.write(row, start, cells)
            write[b, :n] = torch.tensor(cells, dtype=torch.long)
        ctx = [self.lengths[r] + n for r, n in zip(rows, num_new, strict=True)]
        read = self.slots.cells[rows, :max(ctx)]  # (B, S): the gathered rectangle
        self._step = StepLayout(list(rows), write.to(self.device), read,
                                torch.tensor(ctx, device=self.device),
                                [r not in hold for r in rows])
        return self._step

    def end_step(self) -> None:
        step, self._step = self._step, None
        for row, n, grows in zip(step.rows, step.context_lens.tolist(), step.grows, strict=True):
            if grows:
                self.lengths[row] = n

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D); k, v (B, Hkv, T, D) of the new tokens -> (B, Hq, T, D)."""
        step = self._step
        valid = step.write_cells >= 0  # (B, T)
        cells = step.write_cells[valid]  # (N,)
        self.k[layer, cells] = k.transpose(1, 2)[valid]  # (N, Hkv, D)
        self.v[layer, cells] = v.transpose(1, 2)[valid]
        return paged_attention_batched_reference(q, self.k[layer], self.v[layer],
                                                 step.read_cells, positions, step.context_lens)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
