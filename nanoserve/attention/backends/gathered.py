"""The gathered mapping (Day 50): each decode row reads its own context, not the longest row's.

Why this module exists: the Day-28 decode read gathers a (B, S) rectangle of cells, S being the
longest context in the batch, so a row with 10 cached tokens next to one with 2,000 is gathered
and masked at width 2,000. This index lists the batch's *real* context cells instead, in chunks
of ``C`` cells that each belong to one row::

    row 0: 3 tokens, row 1: 5 tokens, C = 4
    cells       = [[c00 c01 c02  -1],     chunk_row = [0,     # a chunk: up to C cells of one row
                   [c10 c11 c12 c13],                  1,
                   [c14  -1  -1  -1]]                  1]     # -1: not a cell (masked)

so the read costs sum(ceil(len / C)) * C cells: each row pays for its own context plus at most
C - 1 cells of padding (C = 32 by default; C = 1 would be exactly the sum of lengths, in
matmuls too small to be quick). The attention itself is ``paged_attention_gathered``.

The index lives on the backend, one per cache, and is kept, not rebuilt: a decode step adds one
cell per running row, in place, opening a new chunk at the end of the list when a row's last
chunk is full (chunks need not be in row order, since each names its row). A row that joins
(after its prefill) is appended whole, once. A row that is reset or moved is *invalidated*: its
chunks are dropped at the next step, in one compaction, and appended again if it comes back.
Invariant, checked each step: for every row in the step, the index holds exactly the cells of
positions 0..ctx-1. ``GatheredBackend`` is the attention backend that keeps it
(``attention="gathered"``).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from nanoserve.attention.backends.base import AttentionBackend

GATHER_CHUNK = 32  # cells per chunk


class GatheredIndex:
    """Chunks of context cells for the rows of a decode step; see the module docstring."""

    def __init__(self, rows: int, chunk: int = GATHER_CHUNK, device: torch.device | str = "cpu"):
        if chunk < 1:
            raise ValueError(f"gather chunk must be >= 1, got {chunk}")
        self.C, self.device = chunk, torch.device(device)
        self.cells = torch.full((64, chunk), -1, dtype=torch.long, device=device)  # (cap, C)
        self.chunk_row = torch.full((64,), -1, dtype=torch.long, device=device)  # (cap,)
        self.chunk_pos = torch.zeros(64, dtype=torch.long, device=device)  # first position
        self.n = 0  # chunks in use
        self.indexed = [0] * rows  # cells of each row held by the index (host)
        self.last = torch.full((rows,), -1, dtype=torch.long, device=device)  # last chunk per row
        self.stale: set[int] = set()
        self.rebuilt_rows = 0  # rows appended whole (joins, after an invalidation)
        self.appended_cells = 0  # cells added one per row per step

    def invalidate(self, row: int | None = None) -> None:
        """Forget ``row`` (all rows if None); its chunks go at the next step."""
        if row is None:
            self.n = 0
            self.indexed = [0] * len(self.indexed)
            self.last.fill_(-1)
            self.stale.clear()
        elif self.indexed[row]:
            self.stale.add(row)

    def _grow(self, need: int) -> None:
        cap = self.cells.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        cells = torch.full((new, self.C), -1, dtype=torch.long, device=self.device)
        cells[:cap] = self.cells
        rows = torch.full((new,), -1, dtype=torch.long, device=self.device)
        rows[:cap] = self.chunk_row
        pos = torch.zeros(new, dtype=torch.long, device=self.device)
        pos[:cap] = self.chunk_pos
        self.cells, self.chunk_row, self.chunk_pos = cells, rows, pos

    def _drop(self, rows: set[int]) -> None:
        """Remove the chunks of ``rows`` in one compaction; renumber the others' last chunks."""
        n = self.n
        gone = torch.tensor(sorted(rows), dtype=torch.long, device=self.device)
        keep = ~torch.isin(self.chunk_row[:n], gone)  # (n,)
        new_id = keep.cumsum(0) - 1  # old chunk id -> new chunk id, where kept
        m = int(keep.sum())
        self.cells[:m] = self.cells[:n][keep]
        self.chunk_row[:m] = self.chunk_row[:n][keep]
        self.chunk_pos[:m] = self.chunk_pos[:n][keep]
        self.cells[m:n] = -1
        self.chunk_row[m:n] = -1
        self.n = m
        held = self.last >= 0
        self.last[held] = new_id[self.last[held]]
        self.last[gone] = -1
        for r in rows:
            self.indexed[r] = 0

    def _append_row(self, row: int, start: int, cells: torch.Tensor) -> None:
        """Append cells of positions start..start+len(cells)-1 of ``row`` (the slow path)."""
        C, k = self.C, len(cells)
        pos = torch.arange(start, start + k, device=self.device)
        first_new = -(-start // C)  # chunks of this row that exist: ceil(start / C)
        need = -(-(start + k) // C) - first_new  # new chunks to open
        self._grow(self.n + need)
        ids = torch.arange(self.n, self.n + need, device=self.device)
        self.chunk_row[ids] = row
        self.chunk_pos[ids] = (first_new + torch.arange(need, device=self.device)) * C
        base = self.last[row].item() if start else 0
        # chunk of each position: the open last chunk for pos < first_new * C, else a new one
        chunk = torch.where(pos < first_new * C, torch.full_like(pos, base),
                            self.n + pos // C - first_new)
        self.cells[chunk, pos % C] = cells
        if need:
            self.last[row] = self.n + need - 1
        self.n += need
        self.indexed[row] = start + k
        self.rebuilt_rows += 1

    def update(self, rows: list[int], ctx: list[int], new_cells: torch.Tensor,
               slot_cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the index to this decode step and return its layout.

        rows       B rows of the step; ctx: their context lengths after this step's token
        new_cells  (B,) the cell each row writes this step (position ctx - 1)
        slot_cells the slot table (rows, max_model_len), read for rows that join
        returns    cells (n, C) with -1 for padding, chunk_b (n,) batch index of each chunk;
                   ``chunk_pos[:n]`` holds the position of each chunk's first cell
        """
        gone = self.stale | {r for r in range(len(self.indexed)) if self.indexed[r]} - set(rows)
        self.stale = set()
        for r, c in zip(rows, ctx, strict=True):
            if self.indexed[r] > c:  # a row that shrank without a reset: rebuild it
                gone.add(r)
        if gone:
            self._drop(gone)
        step_rows, step_pos, step_cells = [], [], []
        for b, (r, c) in enumerate(zip(rows, ctx, strict=True)):
            have = self.indexed[r]
            if have == c - 1:  # the steady state: one new cell
                step_rows.append(r)
                step_pos.append(c - 1)
                step_cells.append(b)
            elif have < c - 1:  # joins: everything up to and including this step's cell
                self._append_row(r, have, slot_cells[r, have:c])
            # have == c: a held row rewriting its cell in place; already indexed
        if step_rows:
            self._append_one(step_rows, step_pos, new_cells[step_cells])
        n = self.n
        b_of_row = torch.full((len(self.indexed),), -1, dtype=torch.long, device=self.device)
        b_of_row[torch.tensor(rows, device=self.device)] = torch.arange(len(rows),
                                                                       device=self.device)
        return self.cells[:n], b_of_row[self.chunk_row[:n]]

    def _append_one(self, rows: list[int], pos: list[int], cells: torch.Tensor) -> None:
        """One new cell per row, vectorised: rows whose last chunk is full open a new one."""
        C = self.C
        rows_t = torch.tensor(rows, device=self.device)
        pos_t = torch.tensor(pos, device=self.device)
        opens = [r for r, p in zip(rows, pos, strict=True) if p % C == 0]
        if opens:
            k = len(opens)
            self._grow(self.n + k)
            ids = torch.arange(self.n, self.n + k, device=self.device)
            opens_t = torch.tensor(opens, device=self.device)
            self.chunk_row[ids] = opens_t
            self.chunk_pos[ids] = torch.tensor([p for p in pos if p % C == 0],
                                               device=self.device)
            self.last[opens_t] = ids
            self.n += k
        self.cells[self.last[rows_t], pos_t % C] = cells
        for r, p in zip(rows, pos, strict=True):
            self.indexed[r] = p + 1
        self.appended_cells += len(rows)

    def num_cells(self) -> int:
        """Cells the next read gathers, padding included: n * C."""
        return self.n * self.C


def paged_attention_gathered(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                             cells: torch.Tensor, chunk_b: torch.Tensor,
                             chunk_pos: torch.Tensor | None = None,
                             q_pos: torch.Tensor | None = None,
                             window: int | None = None) -> torch.Tensor:
    """Decode attention over the gathered mapping: each row reads only its own chunks.

    q        (B, Hq, D)      one query per row, at the row's last position
    k_pool   (cells, Hkv, D) one layer's pool; v_pool likewise
    cells    (n, C)          pool cells of the batch's contexts, C per chunk, -1 for padding
    chunk_b  (n,)            the row (0..B-1) each chunk belongs to
    chunk_pos (n,)           with ``window``: the absolute position of each chunk's first cell
    q_pos    (B,)            with ``window``: each row's query position i
    window   keys j with i - window < j <= i are read (None: the whole context), by absolute
             position, so a decode step sees the window a whole prompt would
    returns  (B, Hq, D)

    A softmax split over chunks: each chunk's scores are a (g x C) matmul per KV head; the
    row's max is a scatter-max over its chunks, and numerator and denominator are summed per row
    with index_add. Scores, max and sums are float32 whatever the pool's dtype.
    """
    B, Hq, D = q.shape
    n, C = cells.shape
    Hkv = k_pool.shape[1]
    g = Hq // Hkv
    flat = cells.clamp(min=0).view(-1)
    # Gather rows of the pool as they lie (a strided gather is many times slower), then view
    # them head-major: (Hkv, n, C, D) with a row stride of Hkv * D, which matmul reads in place.
    keys = k_pool.index_select(0, flat).view(n, C, Hkv, D).permute(2, 0, 1, 3)
    values = v_pool.index_select(0, flat).view(n, C, Hkv, D).permute(2, 0, 1, 3)
    qc = q.view(B, Hkv, g, D).transpose(0, 1).index_select(1, chunk_b)  # (Hkv, n, g, D)
    s = torch.matmul(qc, keys.transpose(-1, -2)).float() * D ** -0.5  # (Hkv, n, g, C)
    hidden = cells < 0  # (n, C)
    if window is not None:
        j = chunk_pos[:, None] + torch.arange(C, device=cells.device)  # (n, C)
        hidden = hidden | (j <= q_pos.index_select(0, chunk_b)[:, None] - window)
    s = s.masked_fill(hidden[None, :, None, :], float("-inf"))
    m = s.new_full((Hkv, B, g), float("-inf")).scatter_reduce_(
        1, chunk_b[None, :, None].expand(Hkv, n, g), s.amax(-1), "amax")  # (Hkv, B, g)
    p = (s - m.index_select(1, chunk_b)[..., None]).exp()  # (Hkv, n, g, C)
    den = s.new_zeros(Hkv, B, g).index_add_(1, chunk_b, p.sum(-1))  # (Hkv, B, g)
    pv = torch.matmul(p.to(values.dtype), values).float()  # (Hkv, n, g, D)
    out = s.new_zeros(Hkv, B, g, D).index_add_(1, chunk_b, pv) / den[..., None]
    out = out.transpose(0, 1)  # (B, Hkv, g, D)
    return out.reshape(B, Hq, D).to(q.dtype)


class GatheredBackend(AttentionBackend):
    """Day 50: each decode row reads its own cells through the gathered mapping, kept up to
    date one cell per row per step; prompts go through the shared paths. A per-layer sliding
    window (Mistral) is read by absolute position on every path: the decode read masks each
    chunk's cells by position, fresh prompts attend to their own keys through the window, and
    the shared rectangle reads (continued chunks, decode rows in a packed step) take it too."""

    name = "gathered"
    reads: ClassVar[tuple[str, ...]] = ("decode",)
    sliding_window: ClassVar[bool] = True
    window_chunk: ClassVar[int | None] = GATHER_CHUNK

    def __init__(self, cache):
        super().__init__(cache)
        self.index = GatheredIndex(len(cache.tables), device=cache.device)

    def forget_row(self, row: int) -> None:
        self.index.invalidate(row)

    def plan_decode(self, step, rows, ctx, cells) -> None:
        step.read = (*self.index.update(rows, ctx, cells, self.cache.slots.cells),
                     self.index.chunk_pos[:self.index.n])  # cells, chunk_b, chunk_pos

    def decode(self, q, kp, vp, positions, step) -> torch.Tensor:
        cells, chunk_b, chunk_pos = step.read
        if self.window is None:  # the whole context: no positions to slice, no extra op
            return paged_attention_gathered(q[:, :, 0], kp, vp, cells, chunk_b)[:, :, None]
        return paged_attention_gathered(q[:, :, 0], kp, vp, cells, chunk_b, chunk_pos,
                                        positions[:, 0], self.window)[:, :, None]

    def window_read(self, q, kp, vp, slot_cells, positions, context_lens, gathered=None,
                    window=None):
        """The graph window's read: its static buffers hold each row's cells from position 0,
        C a chunk, so a chunk's first position is its place in its row times C (``chunk_pos``);
        the window masks by it as the decode read does."""
        cells, chunk_b, chunk_pos = gathered
        if window is None:
            return paged_attention_gathered(q[:, :, 0], kp, vp, cells, chunk_b)[:, :, None]
        return paged_attention_gathered(q[:, :, 0], kp, vp, cells, chunk_b, chunk_pos,
                                        positions[:, 0], window)[:, :, None]

    @classmethod
    def workspace_bytes(cls, context_lens, num_q_heads, num_kv_heads, head_dim, dtype_bytes,
                        chunk=GATHER_CHUNK, block_size=16) -> int:
        """The (n, C) chunk cells (int64), keys and values at (n*C, Hkv, D), the queries per
        chunk (n, Hq, D), scores and probabilities (n, Hq, C) float32 and the per-chunk outputs
        (n, Hq, D) float32, n = sum(ceil(len / C))."""
        Hq, Hkv, D, e = num_q_heads, num_kv_heads, head_dim, dtype_bytes
        n = sum(-(-c // chunk) for c in context_lens)
        return (n * chunk * 8 + 2 * n * chunk * Hkv * D * e + n * Hq * D * e
                + 2 * n * Hq * chunk * 4 + n * Hq * D * 4)
