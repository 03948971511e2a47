"""Day 76 snapshot (frozen): what a verify step is worth, and how it is laid out.

**Worth.** A proposer guesses ``k`` tokens; the target scores them all in one step and keeps
the longest prefix it agrees with, then adds one token of its own. If each proposal is
accepted with probability ``a``, independently, the step emits ``1 + a + a^2 + ... + a^k``
tokens on average::

    expected_tokens(a, k) = (1 - a^(k + 1)) / (1 - a)

A plain decode step emits one token for the cost of one step. A speculative step costs one
verify (``verify`` target steps: about 1 where scoring 1 + k tokens costs about one) plus
``k`` proposals at ``c`` target steps each (0 for n-gram lookup, the draft's step cost for a
draft model), so the speed-up over plain decoding is::

    speedup(a, k, c) = expected_tokens(a, k) / (verify + k * c)

**Layout.** Where the attention backend repeats rows, each of a row's 1 + k tokens is a decode
*entry* of its own: the same row (its block table) at its own position, the row's cached length
plus the token's offset. All of them go through one decode forward (``cap`` splits them into
forwards of at most that many, in entry order, the alternative the chapter weighs): an
entry's earlier positions are written before it reads them.

>>> expected_tokens(0.5, 1), expected_tokens(0.5, 3), expected_tokens(1.0, 4)
(1.5, 1.875, 5.0)
>>> round(speedup(0.8, 4, c=0.0), 4), round(speedup(0.8, 4, c=0.1), 4)
(3.3616, 2.4011)
>>> best_k(0.8, c=0.1)
6
>>> [len(f) for f in decode_forwards([(3, 64, 9)])], decode_forwards([(3, 64, 9)])[0][-1]
([9], (3, 72))
>>> [len(f) for f in decode_forwards([(3, 64, 9)], cap=8)]
[8, 1]
>>> kept_entries([2, 5], want=[1, 5])
[1, 2, 3, 4, 5, 6]
"""

from __future__ import annotations

K_MAX = 16  # the most proposals a step verifies (speculative_config's num_speculative_tokens)


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verify step emits on average: the accepted run of ``k`` proposals, each
    accepted with probability ``a`` once its predecessors were, plus the target's own token."""
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"a={a} must lie in [0, 1] and k={k} must be >= 0")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup(a: float, k: int, c: float = 0.0, verify: float = 1.0) -> float:
    """Tokens per unit of target-step time, over plain decoding's one token per step: a verify
    step costing ``verify`` target steps plus ``k`` proposals at ``c`` target steps each."""
    return expected_tokens(a, k) / (verify + k * c)


def best_k(a: float, c: float, verify: float = 1.0, k_max: int = K_MAX) -> int:
    """The number of proposals (1 .. k_max) with the largest speed-up (the smallest on a tie)."""
    return max(range(1, k_max + 1), key=lambda k: (speedup(a, k, c, verify), -k))


def decode_forwards(rows: list[tuple[int, int, int]],
                    cap: int | None = None) -> list[list[tuple[int, int]]]:
    """``rows``: (row, cached length, tokens scored) for each row of a verify step -> the
    decode forwards that run it, each a list of (row, position) entries in entry order (a
    row's tokens consecutive, rows in the order given): one forward (``cap=None``, what the
    engine does), or at most ``cap`` entries to a forward (the alternative the chapter
    weighs)."""
    if cap is not None and cap < 1:
        raise ValueError(f"cap={cap} must be >= 1")
    entries = [(row, length + j) for row, length, n in rows for j in range(n)]
    cap = cap or len(entries)
    return [entries[i:i + cap] for i in range(0, len(entries), cap)]


def kept_entries(counts: list[int], want: list[int]) -> list[int]:
    """The entries whose logits a verify step needs: each row's last ``want[b]`` of its
    ``counts[b]`` entries (a prefill chunk wants 1, a decode with k proposals 1 + k)."""
    out, end = [], 0
    for n, w in zip(counts, want, strict=True):
        end += n
        out += range(end - w, end)
    return out
