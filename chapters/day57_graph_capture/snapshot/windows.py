"""Day 57 snapshot (frozen): recorded decode windows, without the recording.

A window is one decode step for a fixed number of rows ``b`` (a *bucket*), run over buffers
allocated once. On a card the step is captured into a CUDA graph; the capture needs the same
shapes and addresses on every replay, so everything here is about making a step look the same
every time. Without a card the same window runs eagerly over the same buffers, which is what
this module keeps.

- ``capture_sizes(n)``: powers of two below ``n``, then ``n`` itself; ``bucket_for`` picks the
  smallest that holds a step.
- ``rows_are_a_prefix``: a window reads rows ``0 .. b-1``, so a step replays only when its rows
  are exactly ``0 .. n-1``, in any order.
- ``host_inputs``: the (5, b) table copied in before a step (ids, positions, write cells, source
  rows, context lengths). Row ``i`` of the table is cache row ``i``. A padded row (``n <= i <
  b``) has context 0, so it reads nothing, and repeats row 0's position and write cell with row
  0 as its source, so the one cell it writes gets row 0's own bytes a second time.
- ``StaticBuffers`` and ``EagerWindows``: the buffers, their addresses taken once, and a
  replay that refuses to run if any of them moved.

    >>> capture_sizes(8), capture_sizes(6), [bucket_for(n, capture_sizes(8)) for n in (3, 5)]
    ([1, 2, 4, 8], [1, 2, 4, 6], [4, 8])
    >>> rows_are_a_prefix([2, 0, 1]), rows_are_a_prefix([0, 2])
    (True, False)
    >>> host_inputs([1, 0], [7, 9], lengths={0: 5, 1: 3}, write_cells={0: 40, 1: 13}, b=4)
    [[9, 7, 0, 0], [5, 3, 5, 5], [40, 13, 40, 40], [0, 1, 0, 0], [6, 4, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def bucket_for(n: int, sizes: Sequence[int]) -> int | None:
    return next((b for b in sorted(sizes) if b >= n), None)


def rows_are_a_prefix(rows: Iterable[int]) -> bool:
    rows = list(rows)
    return sorted(rows) == list(range(len(rows)))


def host_inputs(rows: Sequence[int], tokens: Sequence[int], lengths: dict[int, int],
                write_cells: dict[int, int], b: int) -> list[list[int]]:
    """The copy-in for ``rows`` (a prefix) padded to bucket ``b``. ``lengths[r]`` is row r's
    cached length before the step (the new token's position); ``write_cells[r]`` the pool cell
    that position lives in."""
    if not rows_are_a_prefix(rows) or len(rows) > b:
        raise ValueError(f"rows {list(rows)} do not fit a window of {b} rows")
    table = [[0] * b for _ in range(5)]  # ids, positions, write cells, src rows, context
    for row, tok in zip(rows, tokens, strict=True):
        start = lengths[row]
        for k, value in enumerate((tok, start, write_cells[row], row, start + 1)):
            table[k][row] = value
    for i in range(len(rows), b):  # pad: row 0's position and cell, source row 0, reads nothing
        table[1][i], table[2][i] = table[1][0], table[2][0]
    return table


class StaticBuffers:
    """Allocated once for ``rows`` rows: the (5, R) int64 inputs, the (R, E) hidden states out,
    and, for the gathered read, the (R, chunks * chunk) cell map and its (R * chunks,) owners."""

    def __init__(self, rows: int, hidden_size: int, max_context: int, dtype: torch.dtype,
                 gathered: bool = True, chunk: int = 32, device: str = "cpu"):
        self.inputs = torch.zeros(5, rows, dtype=torch.long, device=device)
        self.hidden = torch.zeros(rows, hidden_size, dtype=dtype, device=device)
        chunks = -(-max_context // chunk)
        self.gathered = self.chunk_b = None
        if gathered:
            self.gathered = torch.full((rows, chunks * chunk), -1, dtype=torch.long,
                                       device=device)
            self.chunk_b = torch.arange(rows, device=device).repeat_interleave(chunks)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"inputs": self.inputs, "hidden": self.hidden}
        if self.gathered is not None:
            out |= {"gathered": self.gathered, "chunk_b": self.chunk_b}
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.tensors().items()}


class EagerWindows:
    """Eager replay: ``window(b)`` is the step a graph would record, run as plain code over the
    buffers. The addresses are taken at construction and checked before every replay."""

    def __init__(self, buffers: StaticBuffers, sizes: Sequence[int],
                 window: Callable[[int], None]):
        self.buffers, self.sizes, self.window = buffers, sorted(sizes), window
        self._addresses = buffers.addresses()
        self.replays = self.padded_rows = 0

    def replay(self, rows, tokens, lengths, write_cells) -> int:
        b = bucket_for(len(rows), self.sizes)
        if b is None or not rows_are_a_prefix(rows):
            raise ValueError(f"rows {list(rows)} cannot replay (buckets {self.sizes})")
        if self.buffers.addresses() != self._addresses:
            raise AssertionError("a static buffer moved since the windows were made")
        host = host_inputs(rows, tokens, lengths, write_cells, b)
        self.buffers.inputs[:, :b].copy_(torch.tensor(host, dtype=torch.long))
        self.window(b)
        self.replays += 1
        self.padded_rows += b - len(rows)
        return b
