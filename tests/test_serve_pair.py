"""``bench serve-pair`` with a second nanoserve as the peer (vLLM is not installed in CI): both
servers up, the rounds alternate their order, each round gives both arms the same seed, and the
summary's ratios are taken within rounds."""

from __future__ import annotations

import math

import pytest

from nanoserve.bench import serve_pair
from nanoserve.config import DEFAULT_MODEL


@pytest.mark.slow  # two real servers over a whole workload: the slow tier
def test_pair_alternates_and_summarizes(monkeypatch):
    calls = []
    real = serve_pair.run_bench

    def spy(url, rates, seed, **kw):
        calls.append((url, rates[0], seed))
        return real(url, rates, seed=seed, **kw)
    monkeypatch.setattr(serve_pair, "run_bench", spy)
    args = ("--dtype", "float32", "--max-num-seqs", "4")
    report = serve_pair.run_pair(DEFAULT_MODEL, [math.inf], rounds=2, peer="nanoserve",
                                 nanoserve_args=args, peer_args=args, requests=4,
                                 input_len=8, output_len=8, max_duration_s=60)
    urls = [c[0] for c in calls]
    assert len(set(urls)) == 2 and urls[0] == urls[3] != urls[1] == urls[2]  # A B, then B A
    assert [c[2] for c in calls] == [0, 0, 1, 1]  # one seed per round, both arms
    row = report["summary"]["inf"]
    assert row["failed"] == {"nanoserve": 0, "peer": 0}
    per_round = [rnd["inf"]["nanoserve"]["output_throughput"]
                 / rnd["inf"]["peer"]["output_throughput"] for rnd in report["rounds"]]
    assert math.isclose(row["output_throughput"]["nanoserve_over_peer"],
                        sum(per_round) / 2)  # the median of two is their mean
    assert all(row[k]["nanoserve"] > 0 for k in serve_pair.KEYS)


def test_bad_arguments_are_refused():
    import pytest
    with pytest.raises(ValueError, match="--peer"):
        serve_pair.run_pair(DEFAULT_MODEL, [1.0], peer="sglang")
    with pytest.raises(ValueError, match="--rounds"):
        serve_pair.run_pair(DEFAULT_MODEL, [1.0], rounds=0)
