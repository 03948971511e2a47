"""Day 42 snapshot (frozen): streaming replies with a long prompt arriving among them.

The workload that makes a token budget visible. Most requests are *short*: a prompt of
``input_len`` random ids and a long streamed reply of ``output_len`` tokens, so at any moment
several streams are waiting for their next token. Every ``long_every``-th request (the
``long_every``-th, the ``2 * long_every``-th, ...) is *long*: ``long_len`` prompt ids and a
short reply of ``long_output_len``. Its prefill is the work that a step must fit in beside the
streams' decodes, and how the budget cuts it decides how long those streams stall.

Ids are uniform in ``[low_id, vocab_size)`` from ``random.Random(seed)``, drawn request by
request in order; the order is kept, so the long prompts land evenly in the arrival schedule.

    >>> reqs = long_among_short(6, 4, 8, 32, 3, 2, vocab_size=100, seed=0)
    >>> [(r.label, r.prompt_len, r.expected_output_len) for r in reqs[:3]]
    [('short', 4, 8), ('short', 4, 8), ('long', 32, 2)]
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    prompt_len: int
    expected_output_len: int
    label: str


def long_among_short(num_requests: int, input_len: int, output_len: int, long_len: int,
                     long_every: int, long_output_len: int, vocab_size: int, seed: int,
                     low_id: int = 2) -> list[Request]:
    if min(num_requests, input_len, output_len, long_len, long_every, long_output_len) < 1:
        raise ValueError("every count and length must be at least 1")
    if vocab_size <= low_id:
        raise ValueError(f"vocab_size {vocab_size} leaves no ids at or above {low_id}")
    rng = random.Random(seed)
    out = []
    for i in range(1, num_requests + 1):
        long = i % long_every == 0
        n = long_len if long else input_len
        ids = [rng.randrange(low_id, vocab_size) for _ in range(n)]
        out.append(Request(ids, n, long_output_len if long else output_len,
                           "long" if long else "short"))
    return out
