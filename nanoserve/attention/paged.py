"""The paged KV cache: one pool per layer, a block table and a slot-table row per batch row.

Why this module exists: with paging, a sequence's tokens live in whatever blocks the scheduler's KV
manager handed it, scattered through a shared pool (``tables.py`` says where).
``BatchedPagedKVCache`` is the cache the model runs over: rows are batch slots; it owns the K/V
pools, a ``BlockTable`` and a ``SlotTable`` row per slot, and each row's cached length. To the
model it is an attention context: ``begin_step`` says which rows take how many new tokens, then the
forward writes each layer's K/V into their cells (``attend``) and reads each row's context back.

How the context is read is not this module's business: the cache holds one attention backend,
chosen by name at construction (``nanoserve.attention.selector``), and hands it the step's
layout. A step comes in one of three layouts (``StepLayout.kind``): ``decode`` (one new token
per row), ``padded`` (Day 27's (B, T) rectangle, right-padded to the longest) and ``packed``
(a (1, N) stream of rows one after another, Day 51).

Pools are flat over cells: ``k[layer]`` is (num_blocks * block_size, Hkv, D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nanoserve.attention.selector import backend_class
from nanoserve.attention.tables import BlockTable, SlotTable


@dataclass(slots=True)
class StepLayout:
    """Where one forward's tokens go and what each row reads. B rows, T new tokens (padded)."""

    kind: str  # "decode", "padded" or "packed"
    rows: list[int]
    write_cells: torch.Tensor  # (B, T) pool cell per new token; -1 for padding; (N,) packed
    context_lens: torch.Tensor  # (B,) tokens each row attends to after this step
    grows: list[bool]  # False for a held row: its length stays where it is
    starts: list[int]  # each row's length before the step
    ctx: list[int]  # each row's context after it (host copy of context_lens)
    write_flat: torch.Tensor  # (N,) the real tokens' cells, in stream order
    write_sel: torch.Tensor | None = None  # (N,) their places in the (B*T) stream; None: all
    packed_lens: list[int] | None = None  # packed: each row's new tokens, in order
    read_cells: torch.Tensor | None = None  # (B, S) cell per context position, where read
    read: Any = None  # what the backend planned for this step's read (its own metadata)
    verify: bool = False  # a verify step's entries (``offsets``): a row may repeat (Day 76)


class BatchedPagedKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_model_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 attention: str = "reference",
                 windows: tuple[int | None, ...] = ()):
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
        self.windows = tuple(windows)  # each layer's sliding window, None: full attention
        widest = max((w for w in self.windows if w is not None), default=None)
        if widest is not None and not backend_class(attention).sliding_window:
            raise ValueError(f"attention={attention!r} does not read a sliding window "
                             f"(of {widest} tokens here); attention='reference' does")
        self.backend = backend_class(attention)(self)  # refuses now, not mid-step

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, max_num_seqs: int,
                  max_model_len: int, attention: str = "reference") -> BatchedPagedKVCache:
        cfg, w = model.cfg, model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, num_blocks,
                   block_size, max_num_seqs, max_model_len, w.dtype, w.device, attention,
                   getattr(model, "windows", ()))

    @property
    def attention(self) -> str:
        """The name of the backend that reads this cache."""
        return self.backend.name

    # ------------------------------------------------------------------ rows

    def reset_row(self, row: int) -> list[int]:
        """Forget a row: its length, its addressing; returns its blocks, for their pool."""
        self.lengths[row] = 0
        self.slots.reset_row(row)
        self.backend.forget_row(row)
        return self.tables[row].clear()

    def adopt_prefix(self, row: int, n: int) -> None:
        """An empty row takes its first ``n`` tokens' K/V as already in its blocks (a prefix
        cache hit, Day 43): their cells are addressed and its length set, nothing computed."""
        if self.lengths[row] or self._step is not None:
            raise ValueError(f"row {row} holds {self.lengths[row]} tokens; only an empty row "
                             f"between steps adopts a cached prefix")
        self.slots.write(row, 0, self.tables[row].cells(0, n))
        self.lengths[row] = n
        self.backend.forget_row(row)

    def truncate_row(self, row: int, n: int) -> None:
        """Row ``row`` keeps its first ``n`` tokens' K/V (speculative decoding, Day 76: the
        rejected proposals' cells were written and are forgotten). Its blocks stay: the next
        verify step writes the same positions again. Never grows a row."""
        if self._step is not None or not 0 <= n <= self.lengths[row]:
            raise ValueError(f"row {row} holds {self.lengths[row]} tokens; it cannot be cut "
                             f"to {n}{' during a step' if self._step is not None else ''}")
        if n < self.lengths[row]:
            self.lengths[row] = n
            self.backend.forget_row(row)  # a mapping kept for the longer row is stale

    def drop_blocks(self, row: int, indices: list[int], null: int) -> None:
        """Blocks ``indices`` of row ``row`` left every layer's sliding window and went back to
        the pool (Day 70): their table entries and their positions' cells now name block
        ``null``, which nobody writes, so a read that gathers them finds finite values its
        window mask gives weight 0. The cells they named may belong to another row by now, so
        the backend forgets the row (the gathered mapping re-reads it from the slot table)."""
        table, bs = self.tables[row], self.block_size
        for i in indices:
            table.blocks[i] = null
            self.slots.write(row, i * bs, table.cells(i * bs, (i + 1) * bs))
        if indices:
            self.backend.forget_row(row)

    def move_row(self, src: int, dst: int) -> int:
        """Move row ``src``'s tenant to the empty row ``dst`` (Day 58): a relabel, not a copy.

        The two BlockTables trade places (``src`` ends up with the empty table that ``dst``
        had), the addressing is copied across (``length(src)`` cells on the device), the
        lengths trade too, and the backend forgets both rows. K and V are never touched: block
        ids name places in the pool, and those places stay put. Refuses a non-empty ``dst`` and
        a move during a step. Returns the cells copied."""
        rows = len(self.tables)
        if not (0 <= src < rows and 0 <= dst < rows) or src == dst:
            raise ValueError(f"cannot move row {src} to row {dst} in a cache of {rows} rows")
        if self._step is not None:
            raise RuntimeError("move_row during a step: the rows are being read")
        if self.lengths[dst] or len(self.tables[dst]):
            raise ValueError(f"row {dst} is not empty ({self.lengths[dst]} tokens, "
                             f"{len(self.tables[dst])} blocks); refusing to move row {src} "
                             f"onto it")
        n = self.lengths[src]
        self.slots.move_row(src, dst, n)
        self.tables[src], self.tables[dst] = self.tables[dst], self.tables[src]
        self.lengths[src], self.lengths[dst] = 0, n
        self.backend.forget_row(src)
        self.backend.forget_row(dst)
        return n

    # ------------------------------------------------------------------ a step

    def begin_step(self, rows: list[int], num_new: list[int],
                   hold: frozenset[int] = frozenset(), packed: bool = False,
                   offsets: list[int] | None = None) -> StepLayout:
        """Rows ``rows[b]`` will append ``num_new[b]`` tokens in the next forward.

        A row in ``hold`` writes its one token at its current length without growing (a static
        batch's finished row, recomputed in place until its wave ends). ``packed``: the forward's
        tokens come as one stream (1, N), row after row, N = sum(num_new), instead of a (B, T)
        rectangle right-padded to the longest. ``offsets`` (a verify step, Day 76): a decode
        step in which a row may appear more than once, entry b at position length + offsets[b]
        (0, 1, .. for each row, in order), where the backend ``repeats_rows``. Host work is per
        row, never per token."""
        if offsets is not None:
            self._check_offsets(rows, num_new, offsets, hold or packed)
        elif not rows or len(set(rows)) != len(rows) or len(rows) != len(num_new):
            raise ValueError(f"a step needs distinct rows, one count each: {rows}, {num_new}")
        if min(num_new) < 1:
            raise ValueError(f"every row in a step must take at least one token: {num_new}")
        if packed and hold:
            raise ValueError("a packed step cannot hold rows")
        B, T, bs = len(rows), max(num_new), self.block_size
        starts = [self.lengths[r] + (offsets[b] if offsets else 0) for b, r in enumerate(rows)]
        for row, start, n in zip(rows, starts, num_new, strict=True):
            if start + n > self.max_model_len:
                raise ValueError(f"row {row}: position {start + n - 1} is beyond "
                                 f"max_model_len={self.max_model_len}")
            if start + n > self.tables[row].num_slots:
                self.tables[row].cells(start, start + n)  # raises: the table is too short
        if T == 1:  # decode: one cell per row, in plain integers
            cells = torch.tensor([self.tables[r].blocks[s // bs] * bs + s % bs
                                  for r, s in zip(rows, starts, strict=True)])  # (B,)
            row_of, pos = torch.tensor(rows), torch.tensor(starts)
        else:  # one arange per row: cell = blocks[p // bs] * bs + p % bs
            per_row = [torch.arange(s, s + n) for s, n in zip(starts, num_new, strict=True)]
            cells = torch.cat([torch.tensor(self.tables[r].blocks)[p // bs] * bs + p % bs
                               for r, p in zip(rows, per_row, strict=True)])  # (N,)
            pos = torch.cat(per_row)
            row_of = torch.repeat_interleave(torch.tensor(rows), torch.tensor(num_new))
        dev = self.device
        cells, pos, row_of = cells.to(dev), pos.to(dev), row_of.to(dev)
        self.slots.cells[row_of, pos] = cells
        ctx = [s + n for s, n in zip(starts, num_new, strict=True)]
        common = dict(rows=list(rows), context_lens=torch.tensor(ctx, device=dev),
                      grows=[r not in hold for r in rows], starts=starts, ctx=ctx,
                      write_flat=cells)
        if packed:
            step = StepLayout("packed", write_cells=cells, packed_lens=list(num_new), **common)
        elif T == 1:
            step = StepLayout("decode", write_cells=cells[:, None], verify=offsets is not None,
                              **common)
        else:  # the padded rectangle (Day 27): (B, T), -1 where a row has no token
            b_of = torch.repeat_interleave(torch.arange(B), torch.tensor(num_new)).to(dev)
            within = pos - torch.tensor(starts, device=dev)[b_of]
            write = torch.full((B, T), -1, dtype=torch.long, device=dev)
            write[b_of, within] = cells
            step = StepLayout("padded", write_cells=write, write_sel=b_of * T + within,
                              read_cells=self.slots.cells[rows, :max(ctx)], **common)
        self.backend.plan(step, list(rows), ctx, cells)
        self._step = step
        return step

    def _check_offsets(self, rows: list[int], num_new: list[int], offsets: list[int],
                       other: bool) -> None:
        """A verify step's layout: one token an entry, each row's offsets 0, 1, .. in order."""
        seen: dict[int, int] = {}
        for r, off in zip(rows, offsets, strict=True):
            if off != seen.get(r, -1) + 1:
                raise ValueError(f"row {r}: offsets must run 0, 1, .. in order; got {offsets}")
            seen[r] = off
        if other or set(num_new) != {1} or not self.backend.repeats_rows:
            raise ValueError(f"a step with offsets is a decode step (one token an entry, no "
                             f"held or packed rows) over a backend that repeats rows; "
                             f"{self.attention!r} {'does' if self.backend.repeats_rows else 'not'}")

    def end_step(self) -> None:
        step, self._step = self._step, None
        for row, n, grows in zip(step.rows, step.ctx, step.grows, strict=True):
            if grows:
                self.lengths[row] = n

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D); k, v (B, Hkv, T, D) of the new tokens -> (B, Hq, T, D).

        Packed steps have B = 1 and T = N, the prompts one after another."""
        step = self._step
        B, Hkv, T, D = k.shape
        new_k = k.transpose(1, 2).reshape(B * T, Hkv, D)  # (B*T, Hkv, D), stream order
        new_v = v.transpose(1, 2).reshape(B * T, Hkv, D)
        if step.write_sel is not None:  # drop the padding
            new_k, new_v = new_k[step.write_sel], new_v[step.write_sel]
        self.k[layer].index_copy_(0, step.write_flat, new_k)
        self.v[layer].index_copy_(0, step.write_flat, new_v)
        return self.attend_written(layer, q, k, v, positions)

    def attend_written(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
        """``attend`` once the step's K/V are already in their cells: the backend's read."""
        return self.backend.read(layer, q, k, v, positions, self._step)

    def write_cells(self) -> torch.Tensor:
        """(B*T,) the pool cell of every token of this step's forward, in its stream order, -1
        for padding: where a caller that writes K/V itself (``nanoserve.cpu.fused``) puts them."""
        return self._step.write_cells.reshape(-1).contiguous()

    def kernel_decode(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(block table (B, W), context lens (B,)) when the backend reads this decode step
        through the C++ kernel, else None: what ``decode_layers`` needs to run it itself."""
        return None if self._step is None else self.backend.kernel_decode(self._step)

    @property
    def verifying(self) -> bool:
        """This step is a verify step's decode entries (Day 76): however many rows it has, the
        fused layer loop takes them in one call, since one call reads each weight no more often
        than several calls of fewer rows would."""
        return self._step is not None and self._step.verify

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
