"""Recorded decode windows (Day 57): one per batch-size bucket, replayed instead of a forward.

Why this module exists: at small batch a decode step is hundreds of tiny kernels, and on a card
the host spends longer launching them than the card spends running them. A CUDA graph records
the launches once and replays them with one call. The price is that a recording is frozen: it
reads and writes the same addresses, with the same shapes, every time. So the step has to come
to the recording, not the other way round:

- a **capture list** of batch sizes (``capture_sizes``: 1, 2, 4, 8, ... and ``max_num_seqs``,
  the rule in ``nanoserve.cuda.buckets`` that Day 49's compiled decode uses too); a step of ``n``
  rows is padded up to the next bucket ``b``, as vLLM does;
- **static buffers** of fixed capacity hold everything the window reads or writes: input ids,
  positions, write cells, context lengths, the gathered mapping (wide enough for the longest
  context the window may meet, ``max_model_len``) and the output hidden states. Window ``b``
  reads their first ``b`` rows, and the cache's slot table ``slots[:b]``, so it can only replay
  a step whose rows are exactly ``0..n-1``: ``rows_are_a_prefix``, which is
  ``buckets.is_compact`` (the persistent batch keeps it true; Day 58);
- a **padded row** (``n <= i < b``) reads nothing (context length 0) and writes no cell of its
  own: it repeats row 0's write, same cell and same bytes, so the duplicate is harmless;
- a layer's **sliding window** (Mistral's) reaches the recorded read as a number fixed per layer
  (``window_read(..., window=)``); what it masks is by each row's position, which is in the
  static buffers, so one recording serves every step. The gathered mapping's chunks start at
  fixed positions (chunk ``k`` of a row holds ``k*C ..``), kept as ``chunk_pos``.

On CUDA each bucket's window is captured into a ``torch.cuda.CUDAGraph``, largest first, all
sharing one memory pool, after a warm-up run of each. Without CUDA the very same window code runs
eagerly over the very same buffers ("eager replay"), so the copy-in, the window and the read-out
are tested on a CPU and only the capture needs a card. Either way the buffers' addresses are
recorded when the windows are made and checked on every replay: a buffer that moved would leave a
recorded graph writing to memory nobody reads.

A step that cannot replay (rows not a prefix, a held row of a static batch) falls through to the
eager forward and counts as *scattered*. ``ReplayCounters`` says how often each happened::

    >>> c = ReplayCounters(); c.count(True); c.count(True); c.count(False); c
    ReplayCounters(decode_steps=3, replayed=2, scattered=1, share=67%)
    >>> bucket_for(3, capture_sizes(8)), capture_sizes(12)
    (4, [1, 2, 4, 8, 12])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from nanoserve.cuda.buckets import batch_buckets as capture_sizes  # Day 57's name for them
from nanoserve.cuda.buckets import bucket_for, is_compact

log = logging.getLogger("nanoserve")


def rows_are_a_prefix(rows: Iterable[int]) -> bool:
    """Can a window replay this step? Only if its rows are 0..n-1 (in any order). One
    definition, shared with the scheduler's compaction: ``buckets.is_compact``."""
    return is_compact(rows)


@dataclass(slots=True)
class ReplayCounters:
    """Decode steps, and how many of them replayed a window; the rest were scattered."""

    decode_steps: int = 0
    replayed: int = 0

    @property
    def scattered(self) -> int:
        """Decode steps that ran the eager forward instead (graphs off counts them all)."""
        return self.decode_steps - self.replayed

    @property
    def share(self) -> float:
        return self.replayed / self.decode_steps if self.decode_steps else 0.0

    def count(self, replayed: bool) -> None:
        self.decode_steps += 1
        self.replayed += bool(replayed)

    def __repr__(self) -> str:
        return (f"ReplayCounters(decode_steps={self.decode_steps}, replayed={self.replayed}, "
                f"scattered={self.scattered}, share={self.share:.0%})")


class StaticBuffers:
    """Everything a window reads or writes, allocated once at full capacity (R rows).

    ``inputs`` is one (5, R) int64 tensor so a step's copy-in is a single host-to-device copy;
    its rows are views: ids, positions, write cells, source rows (the row whose K/V a row
    writes: itself, or 0 for a padded row) and context lengths."""

    NAMES = ("ids", "positions", "write_cells", "src_rows", "context_lens")

    def __init__(self, rows: int, hidden_size: int, max_context: int, dtype: torch.dtype,
                 device: torch.device, chunk: int | None = None, windowed: bool = False):
        """``chunk``: keep Day 50's gathered mapping, ``chunk`` cells a chunk (None: the
        window reads the rectangle of the slot table's first rows); ``windowed``: some layer
        has a sliding window, so the mapping keeps each chunk's first position too."""
        self.rows, self.chunk = rows, chunk
        self.inputs = torch.zeros(5, rows, dtype=torch.long, device=device)  # (5, R)
        self.ids, self.positions, self.write_cells, self.src_rows, self.context_lens = (
            self.inputs.unbind(0))  # each (R,)
        self.hidden = torch.zeros(rows, hidden_size, dtype=dtype, device=device)  # (R, E)
        self.chunks_per_row = -(-max_context // chunk) if chunk else 0
        self.gathered = self.chunk_b = self.chunk_pos = None
        if chunk:  # (R, nch * C) cells, -1 past each row's context; (R * nch,) owner row
            self.gathered = torch.full((rows, self.chunks_per_row * chunk), -1,
                                       dtype=torch.long, device=device)
            self.chunk_b = torch.arange(rows, device=device).repeat_interleave(
                self.chunks_per_row)
        if chunk and windowed:  # (R * nch,) each chunk's first position: what a window masks by
            self.chunk_pos = torch.arange(self.chunks_per_row, device=device).repeat(rows) * chunk

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"inputs": self.inputs, "hidden": self.hidden}
        if self.gathered is not None:
            out |= {"gathered": self.gathered, "chunk_b": self.chunk_b}
        if self.chunk_pos is not None:
            out["chunk_pos"] = self.chunk_pos
        return out

    def addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.tensors().items()}


class _WindowBackend:
    """The attention backend a window's forward sees: fixed shapes for ``b`` rows, no host
    work, every address read from the static buffers or the cache's own tensors."""

    def __init__(self, owner: DecodeGraphs, b: int):
        self.o, self.b = owner, b

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """q (b, Hq, 1, D), k/v (b, Hkv, 1, D) -> (b, Hq, 1, D)."""
        o, b, buf = self.o, self.b, self.o.buffers
        cache = o.cache
        kp, vp = cache.k[layer], cache.v[layer]  # (cells, Hkv, D)
        src, write = buf.src_rows[:b], buf.write_cells[:b]
        kp.index_copy_(0, write, k[:, :, 0].index_select(0, src))  # pad rows repeat row 0
        vp.index_copy_(0, write, v[:, :, 0].index_select(0, src))
        gathered = None
        if buf.gathered is not None:
            nch = buf.chunks_per_row
            gathered = (buf.gathered[:b].view(b * nch, buf.chunk),  # (b * nch, C)
                        buf.chunk_b[:b * nch],  # (b * nch,)
                        None if buf.chunk_pos is None else buf.chunk_pos[:b * nch])
        windows = getattr(cache, "windows", ())
        return cache.backend.window_read(q, kp, vp, cache.slots.cells[:b], positions,
                                         buf.context_lens[:b], gathered,
                                         windows[layer] if windows else None)


class DecodeGraphs:
    """The recorded windows of one engine: ``can_replay(rows)``, then ``replay(rows, tokens)``.

    ``capture`` defaults to "is the cache on CUDA"; ``compile`` (a torch.compile backend name,
    or True for inductor) compiles each window's function before it is warmed and captured."""

    def __init__(self, model, cache, max_num_seqs: int, sizes: Sequence[int] | None = None,
                 capture: bool | None = None, compile: bool | str = False, warmup: int = 2):
        self.model, self.cache = model, cache
        self.sizes = sorted(set(sizes or capture_sizes(max_num_seqs)))
        if self.sizes[0] < 1 or self.sizes[-1] > len(cache.tables):
            raise ValueError(f"capture sizes {self.sizes} must lie in 1..{len(cache.tables)} "
                             f"(the cache's rows)")
        self.capture = cache.device.type == "cuda" if capture is None else bool(capture)
        if self.capture and cache.device.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA cache; this one is on {cache.device}")
        self.mode = "cuda graphs" if self.capture else "eager replay"
        self.max_context = cache.max_model_len  # the longest context a window may meet
        self.buffers = StaticBuffers(self.sizes[-1], model.cfg.hidden_size, self.max_context,
                                     model.embed_tokens.weight.dtype, cache.device,
                                     cache.backend.window_chunk,
                                     any(w is not None for w in getattr(cache, "windows", ())))
        self._col = torch.arange(self.max_context, device=cache.device)  # (L,)
        self._fn = self._window
        if compile:
            backend = "inductor" if compile is True else str(compile)
            self._fn = torch.compile(self._window, backend=backend, dynamic=False)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # windows run, by either mode
        self.padded_rows = 0  # pad rows computed, summed over replays
        self.by_bucket = dict.fromkeys(self.sizes, 0)
        self.capture_s = 0.0  # wall time of warm-up and capture (0 in eager replay)
        if self.capture:
            self._capture(warmup)
        self._addresses = self._current_addresses()

    # ------------------------------------------------------------ the window itself

    def _window(self, b: int) -> None:
        """One decode step of ``b`` rows over the static buffers (the code a graph records)."""
        buf, cache = self.buffers, self.cache
        cache.slots.cells[buf.src_rows[:b], buf.positions[:b]] = buf.write_cells[:b]
        if buf.gathered is not None:  # each row's cells up to its context, -1 beyond
            live = self._col[None, :] < buf.context_lens[:b, None]  # (b, L)
            buf.gathered[:b, :self.max_context].copy_(
                torch.where(live, cache.slots.cells[:b], -1))
        h = self.model(buf.ids[:b, None], buf.positions[:b, None],
                       _WindowBackend(self, b))  # (b, 1, E)
        buf.hidden[:b].copy_(h[:, 0])

    def _capture(self, warmup: int) -> None:
        """Warm each window up on a side stream, then record them largest first into one
        shared pool. Refused unless every row is empty: a warm-up writes (row 0's cell)."""
        cache = self.cache
        if any(cache.lengths) or any(len(t) for t in cache.tables):
            raise RuntimeError("windows are captured before any request holds a row")
        t0 = time.perf_counter()
        with torch.inference_mode():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for b in reversed(self.sizes):
                    for _ in range(warmup):
                        self._fn(b)
            torch.cuda.current_stream().wait_stream(side)
            pool = None
            for b in reversed(self.sizes):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    self._fn(b)
                pool = g.pool() if pool is None else pool
                self.graphs[b] = g
            torch.cuda.synchronize()
            cache.slots.cells.fill_(-1)  # the warm-ups addressed row 0; nobody owns it yet
            cache.k[:, 0].zero_()
            cache.v[:, 0].zero_()
        self.capture_s = time.perf_counter() - t0
        log.info("captured %d decode windows %s in %.1f s", len(self.graphs), self.sizes,
                 self.capture_s)

    def _current_addresses(self) -> dict[str, int]:
        c = self.cache
        return self.buffers.addresses() | {"slots": c.slots.cells.data_ptr(),
                                           "k": c.k.data_ptr(), "v": c.v.data_ptr()}

    # ------------------------------------------------------------ a step

    def bucket(self, n: int) -> int | None:
        return bucket_for(n, self.sizes)

    def can_replay(self, rows: Sequence[int]) -> bool:
        return bool(rows) and rows_are_a_prefix(rows) and self.bucket(len(rows)) is not None

    def replay(self, rows: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens[i]`` to row ``rows[i]`` through the window; (n, V) logits in the
        order of ``rows``. Refuses rows that are not a prefix rather than reading other rows."""
        n, cache = len(rows), self.cache
        if len(tokens) != n or not self.can_replay(rows):
            raise ValueError(f"rows {list(rows)} cannot replay a window (buckets {self.sizes})")
        b = self.bucket(n)
        host = [[0] * b for _ in range(5)]  # ids, positions, write cells, src rows, context
        for row, tok in zip(rows, tokens, strict=True):
            start, table = cache.lengths[row], cache.tables[row]
            if start + 1 > self.max_context:
                raise ValueError(f"row {row}: position {start} is beyond "
                                 f"max_model_len={self.max_context}")
            cell = table.cells(start, start + 1)[0]  # raises if the table is too short
            for k, value in enumerate((tok, start, cell, row, start + 1)):
                host[k][row] = value
        for i in range(n, b):  # a pad row: row 0's position and write, nothing to read
            host[1][i], host[2][i] = host[1][0], host[2][0]
        buf = self.buffers
        if self._current_addresses() != self._addresses:
            raise AssertionError("a static buffer moved since the windows were made")
        buf.inputs[:, :b].copy_(torch.tensor(host, dtype=torch.long))  # one host-to-device copy
        if self.capture:
            self.graphs[b].replay()
        else:
            self._fn(b)
        for row in rows:
            cache.lengths[row] += 1
        self.replays += 1
        self.padded_rows += b - n
        self.by_bucket[b] += 1
        order = torch.tensor(list(rows), device=cache.device)
        return self.model.compute_logits(buf.hidden.index_select(0, order))  # (n, V)

    def __repr__(self) -> str:
        return (f"DecodeGraphs({self.mode}, sizes={self.sizes}, replays={self.replays}, "
                f"padded_rows={self.padded_rows})")
