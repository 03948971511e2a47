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

A step comes in one of three layouts: a (B, T) rectangle right-padded to the longest (Day 27's
prefill, and every decode, T = 1), or a packed (1, N) stream of prompts one after another
(``packed=True``). The decode read is ``attention="reference"`` (Day 28's (B, S) rectangle, the
default of a bare cache) or ``"gathered"`` (Day 50: ``gathered.GatheredIndex``, kept on the cache,
updated one cell per row per step, dropped for a row by ``invalidate_gathered``).

Pools are flat over cells: ``k[layer]`` is (num_blocks * block_size, Hkv, D).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.attention.causal import packed_prefill_attention
from nanoserve.attention.gathered import GatheredIndex, paged_attention_gathered
from nanoserve.attention.reference import paged_attention_batched_reference
from nanoserve.config import ATTENTION_PATHS
from nanoserve.cpu.prefill import attend_prompts, chunk_tables, token_tables


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


@dataclass(slots=True)
class StepLayout:
    """Where one forward's tokens go and what each row reads. B rows, T new tokens (padded)."""

    rows: list[int]
    write_cells: torch.Tensor  # (B, T) pool cell per new token; -1 for padding; (N,) packed
    read_cells: torch.Tensor | None  # (B, S) cell per context position; None when gathered
    context_lens: torch.Tensor  # (B,) tokens each row attends to after this step
    grows: list[bool]  # False for a held row: its length stays where it is
    write_flat: torch.Tensor | None = None  # (N,) the real tokens' cells, in stream order
    write_sel: torch.Tensor | None = None  # (N,) their places in the (B*T) stream; None: all
    packed_lens: list[int] | None = None  # packed prefill: each row's new tokens, in order
    starts: list[int] | None = None  # each row's length before the step
    ctx: list[int] | None = None  # each row's context after it (host copy of context_lens)
    gathered: tuple[torch.Tensor, torch.Tensor] | None = None  # (cells (n, C), chunk_b (n,))
    blocks: torch.Tensor | None = None  # (B, W) block ids per row: the Triton kernel's decode
    prompt_tables: tuple[torch.Tensor, torch.Tensor] | None = None  # cpu_prefill, once a step


class BatchedPagedKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_model_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 attention: str = "reference"):
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention={attention!r}; choose one of {ATTENTION_PATHS}")
        if attention == "triton":  # import now: a missing Triton mode fails here, not mid-step
            from nanoserve.cuda import kernels  # noqa: F401
        if attention == "cpu":  # the C++ kernel: refused now if it cannot load, not mid-step
            from nanoserve.cpu import csrc
            if device != "cpu" and torch.device(device).type != "cpu":
                raise ValueError(f"attention='cpu' is a CPU kernel; the cache is on {device}")
            why = csrc.load()
            if why:
                raise ValueError(f"attention='cpu' needs the C++ ops: {why}")
        self.attention = attention  # the decode read: Day 28's rectangle or Day 50's mapping
        self.gathered = GatheredIndex(max_num_seqs, device=device)
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
                  max_model_len: int, attention: str = "reference") -> BatchedPagedKVCache:
        cfg, w = model.cfg, model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, num_blocks,
                   block_size, max_num_seqs, max_model_len, w.dtype, w.device, attention)

    def reset_row(self, row: int) -> list[int]:
        """Forget a row: its length, its addressing; returns its blocks for the allocator."""
        self.lengths[row] = 0
        self.slots.reset_row(row)
        self.invalidate_gathered(row)
        return self.tables[row].clear()

    def adopt_prefix(self, row: int, n: int) -> None:
        """An empty row takes its first ``n`` tokens' K/V as already in its blocks (a prefix
        cache hit, Day 43): their cells are addressed and its length set, nothing computed."""
        if self.lengths[row] or self._step is not None:
            raise ValueError(f"row {row} holds {self.lengths[row]} tokens; only an empty row "
                             f"between steps adopts a cached prefix")
        self.slots.write(row, 0, self.tables[row].cells(0, n))
        self.lengths[row] = n
        self.invalidate_gathered(row)

    def invalidate_gathered(self, row: int | None = None) -> None:
        """The Day-50 gathered mapping forgets ``row`` (every row if None); the next decode step
        drops its chunks and, if the row is in that step, appends its context again. Call it
        whenever a row's cells change other than by growing: reset, move."""
        self.gathered.invalidate(row)

    def move_row(self, src: int, dst: int) -> int:
        """Move row ``src``'s tenant to the empty row ``dst`` (Day 58): a relabel, not a copy.

        The two BlockTables trade places (``src`` ends up with the empty table that ``dst``
        had), the addressing is copied across (``length(src)`` cells on the device), and the
        lengths trade too, and the gathered mapping forgets both rows. K and V are never
        touched: block ids name places in the pool, and those places stay put. Refuses a
        non-empty ``dst`` and a move during a step. Returns the cells copied."""
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
        self.invalidate_gathered(src)
        self.invalidate_gathered(dst)
        return n

    def begin_step(self, rows: list[int], num_new: list[int],
                   hold: frozenset[int] = frozenset(), packed: bool = False) -> StepLayout:
        """Rows ``rows[b]`` will append ``num_new[b]`` tokens in the next forward.

        A row in ``hold`` writes its one token at its current length without growing (a static
        batch's finished row, recomputed in place until its wave ends). ``packed``: the forward's
        tokens come as one stream (1, N), row after row, N = sum(num_new), instead of a (B, T)
        rectangle right-padded to the longest. Host work is per row, never per token."""
        if not rows or len(set(rows)) != len(rows) or len(rows) != len(num_new):
            raise ValueError(f"a step needs distinct rows, one count each: {rows}, {num_new}")
        if min(num_new) < 1:
            raise ValueError(f"every row in a step must take at least one token: {num_new}")
        if packed and hold:
            raise ValueError("a packed step cannot hold rows")
        B, T, bs = len(rows), max(num_new), self.block_size
        starts = [self.lengths[r] for r in rows]
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
        grows = [r not in hold for r in rows]
        if packed:
            step = StepLayout(list(rows), cells, None, torch.tensor(ctx, device=dev), grows,
                              write_flat=cells, packed_lens=list(num_new), starts=starts)
            if self.attention == "reference" or any(starts):
                step.read_cells = self.slots.cells[rows, :max(ctx)]  # (B, S)
        elif T == 1:
            step = StepLayout(list(rows), cells[:, None], None, torch.tensor(ctx, device=dev),
                              grows, write_flat=cells, starts=starts)
            if self.attention == "gathered":
                step.gathered = self.gathered.update(rows, ctx, cells, self.slots.cells)
            elif self.attention in ("triton", "cpu"):  # a block's first cell / bs: its id
                step.blocks = (self.slots.cells[rows, ::bs][:, :-(-max(ctx) // bs)]
                               // bs).contiguous()  # (B, W), -1 past each row's end
            else:
                step.read_cells = self.slots.cells[rows, :max(ctx)]  # (B, S): the rectangle
        else:  # the padded rectangle (Day 27): (B, T), -1 where a row has no token
            b_of = torch.repeat_interleave(torch.arange(B), torch.tensor(num_new)).to(dev)
            within = pos - torch.tensor(starts, device=dev)[b_of]
            write = torch.full((B, T), -1, dtype=torch.long, device=dev)
            write[b_of, within] = cells
            step = StepLayout(list(rows), write, self.slots.cells[rows, :max(ctx)],
                              torch.tensor(ctx, device=dev), grows, write_flat=cells,
                              write_sel=b_of * T + within, starts=starts)
        step.ctx = ctx
        self._step = step
        return step

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

    def kernel_decode(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(block table (B, W), context lens (B,)) when this step is a decode read through the C++
        kernel (``attention="cpu"``, one new token per row), else None: what ``decode_layers``
        needs to run the step's attention itself."""
        step = self._step
        if self.attention != "cpu" or step is None or step.blocks is None:
            return None
        return step.blocks, step.context_lens

    def write_cells(self) -> torch.Tensor:
        """(B*T,) the pool cell of every token of this step's forward, in its stream order, -1
        for padding: where a caller that writes K/V itself (``fused.py``) puts them."""
        return self._step.write_cells.reshape(-1).contiguous()

    def attend_written(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
        """``attend`` once the step's K/V are already in their cells: the read alone."""
        step = self._step
        kp, vp = self.k[layer], self.v[layer]
        if step.packed_lens is not None:
            if step.read_cells is None:  # every prompt starts at 0: its keys are the new ones
                if self.attention == "cpu":  # each token a decode row over its prefix
                    return attend_prompts(q, kp, vp, *self._prompt_tables(step), self.block_size)
                return packed_prefill_attention(q, k, v, step.packed_lens)
            return self._attend_mixed(q, k, v, kp, vp, positions, step)
        if step.blocks is not None and self.attention == "cpu":
            return self._cpu_decode(q, kp, vp, step.blocks, step.context_lens)
        if step.blocks is not None:
            from nanoserve.cuda.kernels import paged_attention
            return paged_attention(q, kp, vp, step.blocks, step.context_lens, self.block_size)
        if step.gathered is not None:
            cells, chunk_b = step.gathered
            return paged_attention_gathered(q[:, :, 0], kp, vp, cells, chunk_b)[:, :, None]
        return paged_attention_batched_reference(q, kp, vp, step.read_cells, positions,
                                                 step.context_lens)

    def _attend_mixed(self, q, k, v, kp, vp, positions, step: StepLayout) -> torch.Tensor:
        """A packed stream whose rows do not all start empty: a continued prefill chunk, a
        prompt after a cache hit, or decode rows riding along (Day 41). Runs of fresh prompts
        go through the packed kernel (not under ``attention="reference"``), runs of one-token
        rows through one batched read, and each continued chunk reads its own context.
        q (1, Hq, N, D) -> (1, Hq, N, D)."""
        out, lens, starts = torch.empty_like(q), step.packed_lens, step.starts
        fresh_packed = self.attention != "reference"  # the reference reads every row itself
        b, s, B = 0, 0, len(lens)
        while b < B:
            e = b + 1
            if starts[b] == 0 and fresh_packed:  # fresh prompts: their keys are the new ones
                while e < B and starts[e] == 0:
                    e += 1
                n = sum(lens[b:e])
                if self.attention == "cpu":
                    tables, ctx = self._prompt_tables(step)
                    out[:, :, s:s + n] = attend_prompts(q[:, :, s:s + n], kp, vp, tables[s:s + n],
                                                        ctx[s:s + n], self.block_size)
                else:
                    out[:, :, s:s + n] = packed_prefill_attention(
                        q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], lens[b:e])
            elif lens[b] == 1:  # one token per row: one (m, Hq, 1, D) batched read
                while e < B and lens[e] == 1 and starts[e] > 0:
                    e += 1
                n = e - b
                qd = q[0, :, s:s + n].transpose(0, 1)[:, :, None]  # (m, Hq, 1, D)
                ctx = max(step.ctx[b:e])
                if self.attention == "cpu":  # the kernel, on the rows' own blocks
                    blocks = (step.read_cells[b:e, :ctx:self.block_size]
                              // self.block_size).contiguous()  # (m, W)
                    got = self._cpu_decode(qd, kp, vp, blocks, step.context_lens[b:e])
                else:
                    got = paged_attention_batched_reference(
                        qd, kp, vp, step.read_cells[b:e, :ctx], positions[0, s:s + n, None],
                        step.context_lens[b:e])  # (m, Hq, 1, D)
                out[0, :, s:s + n] = got[:, :, 0].transpose(0, 1)
            else:  # a continued chunk: its new queries over everything its row holds
                n = lens[b]
                if self.attention == "cpu":  # each new token a decode row over the row
                    tables, ctx = chunk_tables(step.read_cells[b], starts[b], n, self.block_size)
                    out[:, :, s:s + n] = attend_prompts(q[:, :, s:s + n], kp, vp, tables, ctx,
                                                        self.block_size)
                else:
                    out[:, :, s:s + n] = paged_attention_batched_reference(
                        q[:, :, s:s + n], kp, vp, step.read_cells[b:b + 1, :step.ctx[b]],
                        positions[:, s:s + n], step.context_lens[b:b + 1])
            s += n
            b = e
        return out

    def _prompt_tables(self, step: StepLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Each packed token's block table and context for ``cpu_prefill``: the same for every
        layer, so built at the first layer's read and kept on the step."""
        if step.prompt_tables is None:
            step.prompt_tables = token_tables(step.write_flat, step.packed_lens,
                                              [s == 0 for s in step.starts], self.block_size)
        return step.prompt_tables

    def _cpu_decode(self, q, kp, vp, blocks, context_lens) -> torch.Tensor:
        """q (B, Hq, 1, D) through the C++ kernel (csrc/decode_attention.cpp) -> (B, Hq, 1, D)."""
        qc = q[:, :, 0].contiguous()  # (B, Hq, D)
        out = torch.empty_like(qc)
        torch.ops.nanoserve.paged_decode_attention(out, qc, kp, vp, blocks, context_lens,
                                                   self.block_size, q.shape[-1] ** -0.5)
        return out[:, :, None]

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
