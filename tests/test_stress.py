"""The stress test, test-sized: a cramped engine preempting constantly, with random aborts,
gives the roomy engine's tokens, keeps its invariants every iteration, and drains to a full pool.
`make stress` runs the long version on the shipped model."""

from __future__ import annotations

import pytest

from nanoserve.bench.stress import run_stress


@pytest.mark.parametrize("seed", [0, 1])
def test_stress_small(hf_checkpoint, seed):
    out = run_stress(hf_checkpoint("llama3_rope"), requests=20, seed=seed, num_kv_blocks=12,
                     block_size=4, max_num_seqs=6, abort_rate=0.08, prompt_lens=(2, 16),
                     gen_lens=(1, 24))
    assert out["mismatched_requests"] == []
    assert out["pool_full_after_drain"]
    assert out["preemptions"] > 0 and out["aborted"] > 0
    assert out["invariant_checks"] == out["iterations"] + 1


@pytest.mark.slow
def test_stress_long():
    out = run_stress(None, requests=200, seed=7, num_kv_blocks=20, abort_rate=0.05)
    assert out["mismatched_requests"] == [] and out["pool_full_after_drain"]
    assert out["preemptions"] > 50
