"""The C++ CPU kernel as a backend (Day 55): decode rows and prompt tokens read the pool in place.

Why this module exists: ``csrc/decode_attention.cpp`` reads each row's K/V through its block
table with no rectangle and no copy, and a prompt token is a decode row over its own prefix
(``nanoserve.cpu.prefill``), so on a CPU one kernel serves every read a step makes: fresh prompts,
continued chunks, decode rows riding along a mixed step, and plain decode steps, whose block
table the fused layer loop (``decode_layers``) reads too. Only Day 27's padded rectangle goes
through the shared path.

A layer's sliding window (Mistral's) is the kernel's ``window`` on every one of those reads: a
row of context L reads positions L - window .. L - 1 and never a block before them, so a
block that left the window may already be back in the pool.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from nanoserve.attention.backends.base import AttentionBackend
from nanoserve.cpu import csrc
from nanoserve.cpu.prefill import attend_prompts, chunk_tables, token_tables

MAX_GROUP = 64  # query heads per KV head the kernel groups (decode_attention.cpp)
MAX_GROUP_FLOATS = 4096  # group size times head_dim: the kernel's tile on the stack


class CPUBackend(AttentionBackend):
    name = "cpu"
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    reads: ClassVar[tuple[str, ...]] = ("decode", "prefill")
    sliding_window: ClassVar[bool] = True  # the kernel's window, on every read it makes
    repeats_rows: ClassVar[bool] = True  # each decode row reads its own block table

    def __init__(self, cache):
        if cache.device.type != "cpu":  # refused now, not mid-step
            raise ValueError(f"attention='cpu' is a CPU kernel; the cache is on {cache.device}")
        why = csrc.load()
        if why:
            raise ValueError(f"attention='cpu' needs the C++ ops: {why}")
        super().__init__(cache)

    @classmethod
    def shape_problem(cls, spec) -> str | None:
        g = spec.num_q_heads // spec.num_kv_heads
        if g > MAX_GROUP or g * spec.head_dim > MAX_GROUP_FLOATS:
            return (f"{g} query heads of {spec.head_dim} per KV head (the kernel groups at "
                    f"most {MAX_GROUP}, and {MAX_GROUP_FLOATS} floats)")
        return None

    def plan_decode(self, step, rows, ctx, cells) -> None:
        step.read = self.block_ids(rows, ctx)  # (B, W)

    def kernel_decode(self, step):
        return (step.read, step.context_lens) if step.kind == "decode" else None

    def decode(self, q, kp, vp, positions, step) -> torch.Tensor:
        return self._kernel(q, kp, vp, step.read, step.context_lens)

    def prompts(self, q, k, v, kp, vp, step, b, e, s) -> torch.Tensor:
        """Each fresh token a decode row over its own prompt's blocks."""
        if step.read is None:  # the same for every layer: built at the first layer's read
            step.read = token_tables(step.write_flat, step.packed_lens,
                                     [x == 0 for x in step.starts], self.cache.block_size)
        tables, ctx = step.read
        n = q.shape[2]
        return attend_prompts(q, kp, vp, tables[s:s + n], ctx[s:s + n], self.cache.block_size,
                              self.window)

    def rows(self, qd, kp, vp, positions, step, b, e) -> torch.Tensor:
        bs, ctx = self.cache.block_size, max(step.ctx[b:e])
        blocks = (step.read_cells[b:e, :ctx:bs] // bs).contiguous()  # (m, W): the rows' own
        return self._kernel(qd, kp, vp, blocks, step.context_lens[b:e])

    def chunk(self, q, kp, vp, positions, step, b, s) -> torch.Tensor:
        """Each new token of the chunk a decode row over everything its row holds."""
        bs = self.cache.block_size
        tables, ctx = chunk_tables(step.read_cells[b], step.starts[b], q.shape[2], bs,
                                   self.window)
        return attend_prompts(q, kp, vp, tables, ctx, bs, self.window)

    def _kernel(self, q, kp, vp, blocks, context_lens) -> torch.Tensor:
        """q (B, Hq, 1, D) through ``paged_decode_attention`` -> (B, Hq, 1, D)."""
        qc = q[:, :, 0].contiguous()  # (B, Hq, D)
        out = torch.empty_like(qc)
        torch.ops.nanoserve.paged_decode_attention(out, qc, kp, vp, blocks, context_lens,
                                                   self.cache.block_size, q.shape[-1] ** -0.5,
                                                   self.window or 0)
        return out[:, :, None]
