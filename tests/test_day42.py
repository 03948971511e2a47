"""Day 42's frozen workload generator and the package's draw the same requests.

The chapter's numbers are measured on ``nanoserve.bench.workload.long_among_short_requests``;
its snapshot keeps the generator as it stood that day, in plain Python, so a later change to the
package's draws shows up here instead of silently moving the chapter's workload.
"""

from __future__ import annotations

import pytest

from chapters.day42_budget_measured.snapshot.workload import long_among_short
from nanoserve.bench.workload import long_among_short_requests, sample_requests


@pytest.mark.parametrize("args", [
    (24, 16, 64, 768, 4, 8, 2048, 0),  # the chapter's workload
    (10, 3, 5, 40, 3, 2, 50, 7),
    (5, 1, 1, 1, 1, 1, 3, 123),  # every request long, two ids to draw from
])
def test_package_generator_equals_the_frozen_one(args):
    live, frozen = long_among_short_requests(*args), long_among_short(*args)
    assert [(r.prompt, r.prompt_len, r.expected_output_len, r.label) for r in live] == \
        [(r.prompt, r.prompt_len, r.expected_output_len, r.label) for r in frozen]


def test_the_benchmark_draws_through_the_same_generator():
    n, short_in, short_out, seed = 8, 4, 6, 3
    opts = dict(long_len=20, long_every=2, long_output_len=1)
    got = sample_requests("long_among_short", n, 100, seed, input_len=short_in,
                          output_len=short_out, **opts)
    want = long_among_short(n, short_in, short_out, vocab_size=100, seed=seed, **opts)
    assert [r.prompt for r in got] == [r.prompt for r in want]
