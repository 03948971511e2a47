"""Day 45 snapshot (frozen): the prefix_repetition workload, and the hits it determines.

vLLM's *prefix_repetition* dataset: ``num_prefixes`` random prefixes of ``prefix_len`` ids, each
shared by ``num_requests // num_prefixes`` requests that append their own random suffix of
``suffix_len`` ids, every request asking for ``output_len`` tokens, the whole list shuffled.
Ids are uniform in ``[low_id, vocab_size)`` from ``random.Random(seed)``: prefix, then its
suffixes, prefix by prefix, then one shuffle.

What a prefix cache can find in it does not depend on timing. A cache that keeps *full* blocks
under a key chained over every token before them, and never offers a prompt's last token (its
logits pick the first output token), can give a request at most ``(len - 1) // block_size``
blocks; it gives the longest run of them that an earlier request (or a warm-up prompt) already
wrote. ``cached_tokens`` counts those tokens for a list of prompts in order, with nothing
evicted. For prefix_repetition the order does not change the total: in each group one request
is first and misses the prefix, and every other one finds it whole.

    >>> reqs = prefix_repetition(4, 8, 2, 2, 3, vocab_size=50, seed=0)
    >>> cached_tokens([r.prompt for r in reqs], block_size=4)
    16
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    prompt_len: int
    expected_output_len: int


def prefix_repetition(num_requests: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                      output_len: int, vocab_size: int, seed: int,
                      low_id: int = 2) -> list[Request]:
    if num_requests < 1 or num_prefixes < 1 or output_len < 1 or prefix_len < 0:
        raise ValueError("num_requests, num_prefixes and output_len must be at least 1")
    if suffix_len < 1:
        raise ValueError(f"suffix_len must be at least 1, got {suffix_len}")
    if num_requests % num_prefixes:
        raise ValueError(f"num_requests={num_requests} is not a multiple of "
                         f"num_prefixes={num_prefixes}")
    rng = random.Random(seed)
    out = []
    for _ in range(num_prefixes):
        prefix = [rng.randrange(low_id, vocab_size) for _ in range(prefix_len)]
        for _ in range(num_requests // num_prefixes):
            suffix = [rng.randrange(low_id, vocab_size) for _ in range(suffix_len)]
            ids = prefix + suffix
            out.append(Request(ids, len(ids), output_len))
    rng.shuffle(out)
    return out


def cached_tokens(prompts: list[list[int]], block_size: int,
                  warm: list[list[int]] = ()) -> int:
    """Prompt tokens a full-block prefix cache finds for ``prompts``, sent in order after the
    ``warm`` prompts (nothing evicted; a warm prompt's own hits are not counted)."""
    seen: set[tuple[int, ...]] = set()

    def visit(ids: list[int]) -> int:
        found, hitting = 0, True
        for b in range(len(ids) // block_size):
            key = tuple(ids[:(b + 1) * block_size])  # the block and everything before it
            if hitting and b < (len(ids) - 1) // block_size and key in seen:
                found += block_size
            else:
                hitting = False
            seen.add(key)
        return found

    for ids in warm:
        visit(ids)
    return sum(visit(ids) for ids in prompts)
