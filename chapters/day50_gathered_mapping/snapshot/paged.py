"""Day 50 snapshot (frozen): Day 17's paged cache with the gathered mapping as its decode read.

``GatheredPagedKVCache`` is ``BatchedPagedKVCache`` (Day 17) with one change: a decode step
(one new token per row) reads each row's own cells through the ``GatheredIndex`` it keeps,
instead of the (B, S) rectangle. Prefill steps still read the rectangle, and ``reset_row``
invalidates the row in the index rather than rebuilding anything.
"""

from __future__ import annotations

import torch

from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache

from .attention import paged_attention_gathered
from .gathered import GatheredIndex


class GatheredPagedKVCache(BatchedPagedKVCache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gathered = GatheredIndex(len(self.tables), device=self.device)
        self._layout: tuple[torch.Tensor, torch.Tensor] | None = None  # (cells, chunk_b)

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, max_num_seqs: int,
                  max_model_len: int) -> GatheredPagedKVCache:
        cfg, w = model.cfg, model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, num_blocks,
                   block_size, max_num_seqs, max_model_len, w.dtype, w.device)

    def reset_row(self, row: int) -> list[int]:
        self.gathered.invalidate(row)
        return super().reset_row(row)

    def begin_step(self, rows, num_new, hold=frozenset()):
        step = super().begin_step(rows, num_new, hold)
        self._layout = None
        if max(num_new) == 1:  # decode: bring the index to this step, one cell per row
            self._layout = self.gathered.update(list(rows), step.context_lens.tolist(),
                                                step.write_cells[:, 0], self.slots.cells)
        return step

    def attend(self, layer, q, k, v, positions):
        if self._layout is None:  # prefill: Day 17's rectangle
            return super().attend(layer, q, k, v, positions)
        cells = self._step.write_cells[:, 0]  # (B,) one new cell per row
        self.k[layer, cells] = k[:, :, 0]  # (B, Hkv, D)
        self.v[layer, cells] = v[:, :, 0]
        return paged_attention_gathered(q[:, :, 0], self.k[layer], self.v[layer],
                                        *self._layout)[:, :, None]  # (B, Hq, 1, D)
