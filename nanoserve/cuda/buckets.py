"""What a recorded decode graph takes: a batch-size bucket, and rows 0..n-1 of the cache.

Why this module exists: a graph is specialised to its shapes, so a decode batch of ``n`` rows is
padded up to the next *bucket* and runs that bucket's graph. Day 49's compiled decode
(``compiled.decode_buckets``: one ``torch.compile`` graph per bucket) and Day 57's recorded
windows (``graphs.capture_sizes``: one CUDA graph per bucket) use the same list, and a compiled
window must land on a compiled bucket, so the rule is written once, here: the powers of two below
``max_num_seqs``, then ``max_num_seqs`` itself (vLLM's capture list has the same shape): about
``log2(max_num_seqs) + 1`` graphs, and a batch of ``n`` rows is padded to fewer than ``2n``.
A window reads the first rows of the cache, so it replays only a step whose rows are exactly
``0..n-1`` (``is_compact``), which Day 58's compaction keeps true.

```pycon
>>> batch_buckets(12)
[1, 2, 4, 8, 12]
>>> batch_buckets(1), batch_buckets(8)
([1], [1, 2, 4, 8])
>>> [bucket_for(n, batch_buckets(8)) for n in (1, 3, 5, 9)]
[1, 4, 8, None]

```
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def batch_buckets(max_num_seqs: int) -> list[int]:
    """The bucket list: powers of two below ``max_num_seqs``, then ``max_num_seqs``; refuses a
    batch limit below 1 (``ValueError``)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def bucket_for(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``n`` rows, or None if none does."""
    return next((b for b in sorted(sizes) if b >= n), None)


def is_compact(rows: Iterable[int]) -> bool:
    """True when the rows are exactly 0..n-1, in any order (an empty batch is compact).

    This is the one definition of "a recorded window can replay this step": the capture asks it
    every step (``graphs.rows_are_a_prefix`` delegates here) and the persistent batch
    (``nanoserve.engine.compact``) keeps it true."""
    occ = sorted(rows)
    return occ == list(range(len(occ)))
