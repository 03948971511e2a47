"""The engine: a model over a paged KV cache, stepped in batches.

Why this module exists: it is where the pieces meet. ``Engine`` owns the model and the batched
paged cache (its pools and tables; which blocks a row holds is the scheduler's KV manager's
decision, handed over as block ids), and knows two moves:

- ``prefill(rows, token_lists)``: one forward for a batch of prompts of different lengths. By
  default the prompts are *packed* into one (1, N) token stream, N the sum of their lengths, each
  token with its own position and cell and each prompt attending to itself only, so a batch
  costs the sum of its lengths. ``prefill="padded"`` keeps Day 27's policy: right-padded to the
  longest, B times the longest positions computed. ``positions_computed`` against
  ``tokens_computed`` is the difference, counted.
- ``decode(rows, tokens)``: one forward that appends one token to each of B rows, whose contexts
  have different lengths (Day 28). The read is the cache's attention backend's (Day 28's
  rectangle, Day 50's gathered mapping, the C++ kernel or the Triton kernel). With
  ``compile=True`` the decode forward runs through ``torch.compile`` (Day 49,
  ``nanoserve.cuda.compiled``).

Host work per step is per row, never per token: ids, positions and write cells are built from
plain lists in one tensor each, and the gathered mapping is updated, not rebuilt.

``step(SchedulerOutput)`` is one iteration of continuous batching (Day 31): a prefill for
the requests the scheduler just admitted, one batched decode for the ones already running, and
every sampled token fed back through ``Request.append_token``. A request's cache row is its
scheduler slot and nothing else; the scheduler's ``on_release`` hook resets a row the moment its
request lets go of it, before anyone else can land there, and its ``on_move`` hook (``move_row``,
Day 58) relabels a row when the scheduler compacts the batch. A static wave's finished members
(``out.held``, Day 29) are computed in place beside its decodes; without a KV cache
(``kv_cache=False``, Day 4) every scheduled request recomputes its whole sequence.

The engine core (``core.py``) drives these moves. Days 27 to 29 drove them by hand, granting each
row its blocks (``grant``, ``release``): from the engine's own pool on a bare engine, and from the
scheduler's KV manager on an engine a core owns, so that one pool keeps one bookkeeper.
"""

from __future__ import annotations

import torch

from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.config import PREFILL_POLICIES
from nanoserve.cuda.graphs import DecodeGraphs, ReplayCounters
from nanoserve.engine import prompt_logprobs
from nanoserve.engine.block_allocator import BlockAllocator
from nanoserve.engine.kv_manager import KVCacheManager
from nanoserve.engine.request import Request
from nanoserve.engine.verify import verify_step
from nanoserve.sampling.sampler import sample_requests
from nanoserve.spec_decode.stats import SpecDecodingStats

VERIFY_AS_DECODE = 17  # a verify step's row of at most this many tokens runs as decode entries


class InjectedFault(RuntimeError):
    """Raised by ``Engine.step`` on a step named in ``fail_on_step`` (tests only)."""


class EngineBroken(RuntimeError):
    """The engine cannot run another step (a tensor-parallel worker died or hung): the
    step's requests fail and the error travels on, instead of failing each later step."""


class Engine:
    cache_class = BatchedPagedKVCache  # tensor parallelism's rank 0 journals it (tp/mirror.py)

    def __init__(self, model, num_kv_blocks: int, block_size: int, max_num_seqs: int,
                 max_model_len: int, fail_on_step: frozenset[int] = frozenset(),
                 prefill: str = "packed", attention: str = "gathered",
                 compile: bool | str = False, cuda_graphs: bool = False,
                 kv_cache: bool = True):
        if prefill not in PREFILL_POLICIES:
            raise ValueError(f"prefill={prefill!r}; choose one of {PREFILL_POLICIES}")
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.prefill_policy = prefill  # "packed": one stream; "padded": Day 27's rectangle
        self.kv_cache = kv_cache  # False: every step recomputes whole sequences (Day 4)
        self.cache = self.cache_class.for_model(model, num_kv_blocks, block_size,
                                                   max_num_seqs, max_model_len, attention)
        self.num_kv_blocks = num_kv_blocks
        # Where rows granted by hand (Days 27-29, tests) take their blocks: the scheduler's KV
        # manager once a core owns this engine (one bookkeeper for one pool, ``share_pool``),
        # else the engine's own; and which rows hold such blocks now.
        self.hand_pool: BlockAllocator | KVCacheManager | None = None
        self.hand_rows: set[int] = set()
        # The placeholder of a block a sliding window gave back (Day 70): the scheduler's KV
        # manager's null block, once a core shares it (None: no block is ever given back).
        self.null_block: int | None = None
        self.forward_passes = 0
        self.row_steps = 0  # rows issued, summed over forwards
        self.tokens_computed = 0  # real (unpadded) token positions run through the model
        self.positions_computed = 0  # positions the model ran, padding included (B*T padded)
        self.compiled = None
        if compile:
            from nanoserve.cuda.compiled import CompiledDecode
            backend = "inductor" if compile is True else str(compile)
            self.compiled = CompiledDecode(model, max_num_seqs, backend)  # Day 49: decode only
        # Day 57: decode through recorded windows (CUDA graphs; eager replay without CUDA).
        self.replay_counters = ReplayCounters()  # decode steps, replayed, scattered
        self.graphs = None
        if cuda_graphs:
            self.graphs = DecodeGraphs(model, self.cache, max_num_seqs,
                                       compile=compile if self.device.type == "cuda" else False)
        self.steps = 0  # calls of step(): one per scheduler iteration that runs the model
        self.spec_stats = SpecDecodingStats()  # verify steps' proposals and acceptances
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
        if T == 1:  # decode: one token per row, no padding, no per-row tensors
            ids = torch.tensor(token_lists, dtype=torch.long)  # (B, 1)
            pos = torch.tensor([[self.cache.lengths[r]] for r in rows], dtype=torch.long)
        else:
            ids = torch.zeros(B, T, dtype=torch.long)  # (B, T), right-padded
            pos = torch.zeros(B, T, dtype=torch.long)  # (B, T); padding sits at position 0
            for b, (row, toks) in enumerate(zip(rows, token_lists, strict=True)):
                start = self.cache.lengths[row]
                ids[b, :len(toks)] = torch.tensor(toks)
                pos[b, :len(toks)] = torch.arange(start, start + len(toks))
        self.cache.begin_step(rows, lens, hold)
        try:
            if T == 1 and self.compiled is not None:
                logits = self.compiled(ids.to(self.device), pos.to(self.device), self.cache)
            else:
                h = self.model(ids.to(self.device), pos.to(self.device), self.cache)  # (B, T, E)
                last = torch.tensor(lens, device=self.device) - 1
                logits = self.model.compute_logits(h[torch.arange(B, device=self.device), last])
        finally:
            self.cache.end_step()
        self._count(B, sum(lens), B * T)
        return logits  # (B, V)

    def _forward_packed(self, rows: list[int], token_lists: list[list[int]],
                        want: list[int] | None = None) -> torch.Tensor:
        """Packed prefill: the prompts as one (1, N) stream, N = sum of lengths, each with its
        own positions and cells, each attending to itself only; returns (B, V) logits, or with
        ``want`` the logits of each row's last ``want[b]`` tokens, (sum(want), V)."""
        lens = [len(t) for t in token_lists]
        ids = torch.cat([torch.tensor(toks, dtype=torch.long) for toks in token_lists])[None]
        pos = torch.cat([torch.arange(self.cache.lengths[r], self.cache.lengths[r] + n)
                         for r, n in zip(rows, lens, strict=True)])[None]  # (1, N)
        self.cache.begin_step(rows, lens, packed=True)
        try:
            h = self.model(ids.to(self.device), pos.to(self.device), self.cache)  # (1, N, E)
        finally:
            self.cache.end_step()
        last = torch.tensor(lens).cumsum(0) - 1  # (B,) each prompt's end
        if want is not None:  # a verify step (Day 76): each row's last want[b] positions
            last = torch.cat([torch.arange(e - w + 1, e + 1)
                              for e, w in zip(last.tolist(), want, strict=True)])
        self._count(len(rows), sum(lens), sum(lens))
        return self.model.compute_logits(h[0, last.to(self.device)])

    def prefill(self, rows: list[int], token_lists: list[list[int]]) -> torch.Tensor:
        """One forward for a batch of prompts: packed (default) or padded (Day 27)."""
        if self.prefill_policy == "packed":
            return self._forward_packed(rows, token_lists)
        return self._forward(rows, token_lists)

    def score(self, rows: list[int], token_lists: list[list[int]],
              want: list[int]) -> torch.Tensor:
        """A verify step's forward (Day 76): the logits of each row's last ``want[b]`` tokens,
        (sum(want), V). Where every row continues a cached row with a few tokens and the
        backend repeats rows, it is one decode step over one entry per token (each proposal a
        row of its own over the same blocks: the decode path, its kernels and its C++ layer
        loop, which takes a verify step's entries whatever their number); otherwise one packed
        forward, whatever the prefill policy."""
        lens = [len(t) for t in token_lists]
        if not (self.cache.backend.repeats_rows and max(lens) <= VERIFY_AS_DECODE
                and all(self.cache.lengths[r] for r in rows)):
            return self._forward_packed(rows, token_lists, want)
        entries = [r for r, n in zip(rows, lens, strict=True) for _ in range(n)]
        tokens = [t for toks in token_lists for t in toks]
        h = self._decode_entries(entries, tokens)  # (N, E): one decode forward
        self._count(len(rows), len(entries), len(entries))
        ends = torch.tensor(lens).cumsum(0).tolist()
        keep = [i for e, w in zip(ends, want, strict=True) for i in range(e - w, e)]
        h = h if len(keep) == len(entries) else h[torch.tensor(keep, device=h.device)]
        # the head in pieces its small-M kernel takes (past them a large vocabulary's head
        # leaves that kernel for one several times slower at these sizes)
        cap = getattr(getattr(self.model.lm_head, "method", None), "rows", 0) or len(h)
        return torch.cat([self.model.compute_logits(h[i:i + cap])
                          for i in range(0, len(h), cap)])

    def _decode_entries(self, entries: list[int], tokens: list[int]) -> torch.Tensor:
        """One decode forward over ``entries`` (rows, a row once per token, in order) -> each
        entry's final hidden state (n, E)."""
        offsets, seen = [], {}  # each entry's place among its row's entries: 0, 1, ..
        for r in entries:
            seen[r] = seen.get(r, -1) + 1
            offsets.append(seen[r])
        ids = torch.tensor(tokens)[:, None]  # (n, 1)
        pos = torch.tensor([self.cache.lengths[r] + j
                            for r, j in zip(entries, offsets, strict=True)])[:, None]  # (n, 1)
        self.cache.begin_step(entries, [1] * len(entries), offsets=offsets)
        try:
            h = self.model(ids.to(self.device), pos.to(self.device), self.cache)  # (n, 1, E)
        finally:
            self.cache.end_step()
        return h[:, 0]

    def decode(self, rows: list[int], tokens: list[int],
               hold: frozenset[int] = frozenset()) -> torch.Tensor:
        g = self.graphs
        replay = g is not None and not hold and g.can_replay(rows)
        self.replay_counters.count(replay)
        if not replay:  # scattered (or graphs off): the eager forward
            return self._forward(rows, [[t] for t in tokens], hold)
        logits = g.replay(rows, tokens)  # (B, V)
        B = len(rows)
        self._count(B, B, g.bucket(B))  # the window's rows, padding included
        return logits

    def _count(self, rows: int, tokens: int, positions: int) -> None:
        """One forward: ``rows`` rows, ``tokens`` real tokens, ``positions`` run (padding too)."""
        self.forward_passes += 1
        self.row_steps += rows
        self.tokens_computed += tokens
        self.positions_computed += positions

    def close(self) -> None:
        """Release what the engine holds outside this process (nothing, on one rank)."""

    # ------------------------------------------------------------ continuous batching

    def _given_back(self, row: int, have: list[int], want: list[int]) -> list[int]:
        """Where a row's blocks ``have`` and its request's ``want`` (as long) differ: only
        where the request's is the null block (a window gave that block back, Day 70); any
        other difference is a bookkeeping bug and raises."""
        diff = [i for i, (a, b) in enumerate(zip(have, want, strict=True)) if a != b]
        if any(want[i] != self.null_block for i in diff) or (diff and self.null_block is None):
            raise RuntimeError(f"row {row} holds blocks {have}, not a prefix of its request's "
                               f"{want}")
        return diff

    def sync_blocks(self, request: Request) -> None:
        """Tell the request's row about blocks the scheduler gave it (BlockTable.extend), and
        about blocks a window gave back: their entries become the null block."""
        table = self.cache.tables[request.slot]
        n = len(table)
        if len(request.blocks) < n:
            raise RuntimeError(f"row {request.slot} holds blocks {table.blocks}, not a prefix "
                               f"of its request's {request.blocks}")
        if table.blocks != request.blocks[:n]:
            gone = self._given_back(request.slot, table.blocks, request.blocks[:n])
            self.cache.drop_blocks(request.slot, gone, self.null_block)
        table.extend(request.blocks[n:])

    def release_row(self, request: Request) -> None:
        """The scheduler's on_release hook: forget the row; the scheduler frees the blocks."""
        blocks = self.cache.reset_row(request.slot)
        if len(request.blocks) < len(blocks):
            raise RuntimeError(f"row {request.slot} held {blocks}, not its request's blocks")
        self._given_back(request.slot, blocks, request.blocks[:len(blocks)])

    def move_row(self, src: int, dst: int) -> int:
        """The scheduler's on_move hook (Day 58, ``compact_rows``): hand row ``src``'s tenant
        to the empty row ``dst``. A relabel of tables and addressing; no K/V is copied."""
        n = self.cache.move_row(src, dst)
        if src in self.hand_rows:  # a row granted by hand keeps being one where it lands
            self.hand_rows.remove(src)
            self.hand_rows.add(dst)
        return n

    def _run(self, requests: list[Request], token_lists: list[list[int]], prefill: bool,
             sample: list[bool] | None = None, hold: frozenset[int] = frozenset()
             ) -> list[Request]:
        """One forward over ``requests`` (each its row), then a token for each row whose
        ``sample`` is true (all by default): a chunk short of its prompt's end emits none, nor
        does a held row (``hold``: rows computed in place, not grown)."""
        for r in requests:
            self.sync_blocks(r)
        rows = [r.slot for r in requests]
        if prefill:
            logits = self._prefill_logits(requests, rows, token_lists)  # (B, V)
        else:
            logits = self.decode(rows, [t for (t,) in token_lists], hold)  # (B, V)
        if sample is not None and not all(sample):
            keep = [b for b, s in enumerate(sample) if s]
            if not keep:
                return []
            requests = [requests[b] for b in keep]
            logits = logits[torch.tensor(keep, device=logits.device)]  # (B', V)
        tokens = sample_requests(logits, requests)
        return [r for r, t in zip(requests, tokens, strict=True) if r.append_token(t)]

    def _prefill_logits(self, requests: list[Request], rows: list[int],
                        token_lists: list[list[int]]) -> torch.Tensor:
        """``prefill``'s (B, V); where a row asks for prompt logprobs, a ``score`` over the
        positions it needs instead, recorded on the way (``prompt_logprobs.py``)."""
        starts, lens = [self.cache.lengths[r] for r in rows], [len(t) for t in token_lists]
        want = prompt_logprobs.plan(requests, starts, lens)
        if want is None:
            return self.prefill(rows, token_lists)
        logits = self.score(rows, token_lists, want)  # (sum(want), V)
        return prompt_logprobs.record(logits, requests, starts, lens, want)

    @torch.inference_mode()
    def step(self, out) -> list[Request]:
        """One iteration: prefill the chunks, decode the running; returns who finished.

        Always under inference mode, whoever steps: ``LLM`` and the async engine enter it, but a
        caller of ``EngineCore.step`` need not, and with autograd on every op records a graph no
        one will use (and oneDNN's packed linear chose its training primitive; see
        ``OpaqueLinearMethod.apply``).

        Chunked prefill (``out.mixed``, Day 41) puts both in one packed forward: each chunk's
        tokens, then each decode's one token, every row at its own positions. A step with no
        chunk is a plain decode step, so it still replays a recorded window; a mixed step runs
        eagerly. Without it, prefill and decode are two forwards, as before the budget."""
        self.steps += 1
        if self.steps in self.fail_on_step:
            raise InjectedFault(f"injected fault on engine step {self.steps}")
        if not self.kv_cache:
            return self._step_uncached(out)
        chunks = out.chunks
        for c in chunks:  # a prefix hit: the row starts with cached blocks it did not compute
            if self.cache.lengths[c.request.slot] != c.start:
                self.sync_blocks(c.request)
                self.cache.adopt_prefix(c.request.slot, c.start)
        if any(r.spec_token_ids for r in out.decode):  # proposals to verify (Day 76)
            return verify_step(self, out)
        tokens = [c.request.token_ids[c.start:c.start + c.n] for c in chunks]
        decode_tokens = [[r.output_token_ids[-1]] for r in out.decode]
        if out.mixed and chunks and out.decode:
            return self._run([c.request for c in chunks] + out.decode, tokens + decode_tokens,
                             True, [c.completes for c in chunks] + [True] * len(out.decode))
        finished = []
        if chunks:
            finished += self._run([c.request for c in chunks], tokens, True,
                                  [c.completes for c in chunks])
        if out.held:  # a static wave: its finished members computed in place, in row order
            wave = sorted(out.decode + out.held, key=lambda r: r.slot)
            finished += self._run(wave, [[r.output_token_ids[-1]] for r in wave], False,
                                  [not r.is_finished for r in wave],
                                  frozenset(r.slot for r in out.held))
        elif out.decode:
            finished += self._run(out.decode, decode_tokens, False)
        return finished

    def _step_uncached(self, out) -> list[Request]:
        """Day 4: no cache, so each request that gets a token this step runs its whole
        sequence through the model again, alone (a prompt chunk short of its end computes
        nothing: there is nowhere to keep its K/V)."""
        finished = []
        for r in out.sampled:
            seq = r.token_ids
            ids = torch.tensor([seq], device=self.device)  # (1, T)
            h = self.model(ids, torch.arange(len(seq), device=self.device)[None])  # (1, T, E)
            self._count(1, len(seq), len(seq))
            prompt_logprobs.record_whole(self.model.compute_logits, h[0], r)
            token = sample_requests(self.model.compute_logits(h[:, -1]), [r])[0]
            if r.append_token(token):
                finished.append(r)
        return finished

    # ------------------------------------------------------------ rows by hand (Days 27-29)

    def grant(self, row: int, num_tokens: int) -> None:
        """Make row ``row`` able to hold ``num_tokens`` tokens, its blocks from ``hand_pool``,
        all or none: how Days 27 to 29 drove the engine, before a scheduler did. Between a
        core's steps only: the rows are released before the scheduler runs again."""
        if self.hand_pool is None:
            self.hand_pool = BlockAllocator(self.num_kv_blocks, self.cache.block_size)
        table = self.cache.tables[row]
        if len(table) and row not in self.hand_rows:
            raise RuntimeError(f"row {row} holds a scheduled request's blocks; grant by hand "
                               f"only a row nobody else holds")
        need = self.hand_pool.blocks_for_length(num_tokens) - len(table)
        if len(table) + need > table.capacity:
            raise ValueError(f"row {row}: {num_tokens} tokens exceed max_model_len="
                             f"{self.cache.max_model_len}")
        if need > 0:
            table.extend(self.hand_pool.allocate(need))
        self.hand_rows.add(row)

    def release(self, row: int) -> None:
        """Reset a row granted by hand and return its blocks to ``hand_pool``."""
        if row not in self.hand_rows:
            raise RuntimeError(f"row {row} was not granted by hand")
        self.hand_rows.discard(row)
        self.hand_pool.free(self.cache.reset_row(row))

    def share_pool(self, pool: KVCacheManager) -> None:
        """A core owns this engine: rows granted by hand, between its steps, take their blocks
        from the scheduler's KV manager. Refused while rows hold blocks of another pool."""
        if self.hand_rows:
            raise RuntimeError(f"rows {sorted(self.hand_rows)} hold blocks granted by hand")
        self.hand_pool = pool
        self.null_block = pool.null_block
