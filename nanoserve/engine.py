"""The engine: a model over a paged KV cache, stepped in batches.

Why this module exists: it is where the pieces meet. ``Engine`` owns the model, the block pool
and the batched paged cache, and knows two moves:

- ``prefill(rows, token_lists)``: one forward for a batch of prompts of different lengths (Day 27).
  Prompts are right-padded to the longest; each row gets its own positions, writes K/V only for
  its real tokens, and is read back at its own last token.
- ``decode(rows, tokens)``: one forward that appends one token to each of B rows, whose contexts
  have different lengths (Day 28).

``step(SchedulerOutput)`` is one iteration of continuous batching (Day 31): a padded prefill for
the requests the scheduler just admitted, one batched decode for the ones already running, and
every sampled token fed back through ``Request.append_token``. A request's cache row is its
scheduler slot and nothing else; the scheduler's ``on_release`` hook resets a row the moment its
request lets go of it, before anyone else can land there.

``LLM`` (in ``llm.py``) drives these moves.
"""

from __future__ import annotations

import torch

from .block_allocator import BlockAllocator
from .paged import BatchedPagedKVCache
from .request import Request
from .sampling import sample_requests


class InjectedFault(RuntimeError):
    """Raised by ``Engine.step`` on a step named in ``fail_on_step`` (tests only)."""


class Engine:
    def __init__(self, model, num_kv_blocks: int, block_size: int, max_num_seqs: int,
                 max_model_len: int, fail_on_step: frozenset[int] = frozenset()):
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.allocator = BlockAllocator(num_kv_blocks, block_size)
        self.cache = BatchedPagedKVCache.for_model(model, num_kv_blocks, block_size,
                                                   max_num_seqs, max_model_len)
        self.forward_passes = 0
        self.row_steps = 0  # rows issued, summed over forwards
        self.tokens_computed = 0  # real (unpadded) token positions run through the model
        self.steps = 0  # calls of step(): one per scheduler iteration that runs the model
        # A test hook, off by default and unreachable from HTTP: step() raises InjectedFault
        # on these step numbers (1-based), so the tests can watch a forward fail mid-service.
        self.fail_on_step = frozenset(fail_on_step)

    def _forward(self, rows: list[int], token_lists: list[list[int]],
                 hold: frozenset[int] = frozenset()) -> torch.Tensor:
        """Append token_lists[b] to row rows[b]; return each row's last-token logits (B, V).

        Rows in ``hold`` are computed but do not grow: their token is written at their current
        length, again and again. That is a static batch's finished row, still in the rectangle.
        """
        lens = [len(t) for t in token_lists]
        B, T = len(rows), max(lens)
        ids = torch.zeros(B, T, dtype=torch.long)  # (B, T), right-padded
        pos = torch.zeros(B, T, dtype=torch.long)  # (B, T); padding sits at position 0
        for b, (row, toks) in enumerate(zip(rows, token_lists, strict=True)):
            start = self.cache.lengths[row]
            ids[b, :len(toks)] = torch.tensor(toks)
            pos[b, :len(toks)] = torch.arange(start, start + len(toks))
        self.cache.begin_step(rows, lens, hold)
        try:
            h = self.model(ids.to(self.device), pos.to(self.device), self.cache)  # (B, T, E)
        finally:
            self.cache.end_step()
        last = torch.tensor(lens, device=self.device) - 1
        self.forward_passes += 1
        self.row_steps += B
        self.tokens_computed += sum(lens)
        return self.model.compute_logits(h[torch.arange(B, device=self.device), last])

    def prefill(self, rows: list[int], token_lists: list[list[int]]) -> torch.Tensor:
        return self._forward(rows, token_lists)

    def decode(self, rows: list[int], tokens: list[int],
               hold: frozenset[int] = frozenset()) -> torch.Tensor:
        return self._forward(rows, [[t] for t in tokens], hold)

    # ------------------------------------------------------------ continuous batching

    def sync_blocks(self, request: Request) -> None:
        """Tell the request's row about blocks the scheduler gave it (BlockTable.extend)."""
        table = self.cache.tables[request.slot]
        if table.blocks != request.blocks[:len(table)]:
            raise RuntimeError(f"row {request.slot} holds blocks {table.blocks}, not a prefix "
                               f"of its request's {request.blocks}")
        table.extend(request.blocks[len(table):])

    def release_row(self, request: Request) -> None:
        """The scheduler's on_release hook: forget the row; the scheduler frees the blocks."""
        blocks = self.cache.reset_row(request.slot)
        if blocks != request.blocks[:len(blocks)]:
            raise RuntimeError(f"row {request.slot} held {blocks}, not its request's blocks")

    def _run(self, requests: list[Request], token_lists: list[list[int]]) -> list[Request]:
        for r in requests:
            self.sync_blocks(r)
        rows = [r.slot for r in requests]
        logits = self._forward(rows, token_lists)  # (B, V)
        tokens = sample_requests(logits, requests)
        return [r for r, t in zip(requests, tokens, strict=True) if r.append_token(t)]

    def step(self, out) -> list[Request]:
        """One iteration: prefill the admitted, decode the running; returns who finished."""
        self.steps += 1
        if self.steps in self.fail_on_step:
            raise InjectedFault(f"injected fault on engine step {self.steps}")
        finished = []
        if out.admitted:  # the prefill runs over token_ids: all a request's tokens so far
            finished += self._run(out.admitted, [r.token_ids for r in out.admitted])
        if out.decode:
            finished += self._run(out.decode, [[r.output_token_ids[-1]] for r in out.decode])
        return finished

    # ------------------------------------------------------------ static batches (Day 29)

    def grant(self, row: int, num_tokens: int) -> None:
        """Make row ``row`` able to hold ``num_tokens`` tokens, allocating blocks atomically."""
        table = self.cache.tables[row]
        need = self.allocator.blocks_for_length(num_tokens) - len(table)
        if len(table) + need > table.capacity:
            raise ValueError(f"row {row}: {num_tokens} tokens exceed max_model_len="
                             f"{self.cache.max_model_len}")
        if need > 0:
            table.extend(self.allocator.allocate(need))

    def release(self, row: int) -> None:
        """Reset a row and return its blocks to the pool."""
        self.allocator.free(self.cache.reset_row(row))
