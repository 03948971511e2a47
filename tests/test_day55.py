"""Day 55's frozen model of the CPU decode-attention kernel against the compiled op.

The snapshot (chapters/day55_cpu_paged_attention/snapshot/paged_decode.py) writes the kernel's
algorithm in plain torch: tasks of (row, KV head, split of 512 tokens), 16-token tiles, an
online softmax, the splits combined per row. Here it must give the compiled op's output on
seeded ragged batches (float32 to the order of a sum, bf16 to one rounding of the output), its
counters must say what the C++ loop runs, its constants must be those of the frozen C++ copy,
and its docstring examples must hold.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest
import torch

from nanoserve.cpu import csrc

SNAPSHOT = Path(__file__).resolve().parents[1] / "chapters" / "day55_cpu_paged_attention" / \
    "snapshot"


@pytest.fixture(scope="module")
def snap():
    from chapters.day55_cpu_paged_attention.snapshot import paged_decode
    return paged_decode


@pytest.fixture(scope="module")
def claims():
    why = csrc.load()
    if why:
        pytest.skip(f"the C++ ops are unavailable: {why}")
    from chapters.day55_cpu_paged_attention import claims
    return claims


SHAPES = [  # (lens, block_size, KV heads, group, head_dim)
    ([1, 513, 40], 16, 2, 3, 72),
    ([1100], 1, 1, 8, 80),
    ([7, 300, 1025, 64], 32, 3, 1, 48),
]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"lens{s[0]}-bs{s[1]}-g{s[3]}-d{s[4]}")
def test_the_frozen_model_equals_the_compiled_kernel(claims, shape, dtype, atol):
    lens, bs, hkv, group, d = shape
    args = claims.case(lens, bs, hkv, group, d, dtype, seed=len(lens) + bs)
    got = claims.model(*args, bs)
    want = claims.kernel(*args, bs)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_the_counters_say_what_the_loop_runs(snap):
    lens, bs, hkv, group, d = [1, 513, 40], 16, 2, 3, 8
    g = torch.Generator().manual_seed(0)
    W = -(-max(lens) // bs)
    table = torch.arange(len(lens) * W).view(len(lens), W)
    pool = torch.randn(len(lens) * W * bs, hkv, d, generator=g)
    q = torch.randn(len(lens), hkv * group, d, generator=g)
    counts = snap.Counts()
    snap.paged_decode_attention(q, pool, pool, table, torch.tensor(lens), bs, 1.0, counts)
    splits = [-(-n // snap.K_SPLIT) for n in lens]  # 1, 2, 1: the row of 513 has 2
    assert snap.task_grid(len(lens), hkv, lens) == (3, hkv, 2)
    assert counts.tasks == hkv * sum(splits)  # empty splits of the short rows are skipped
    assert counts.k_rows == hkv * sum(lens)  # each K vector once, for all `group` heads
    assert counts.tiles == hkv * (1 + 32 + 1 + 3)  # 513 = 512 (32 tiles) + 1 (one tile)


def test_the_constants_are_the_frozen_sources(snap):
    cpp = (SNAPSHOT / "decode_attention.cpp").read_text()
    assert int(re.search(r"kSplit = (\d+)", cpp)[1]) == snap.K_SPLIT
    assert int(re.search(r"kTile = (\d+)", cpp)[1]) == snap.K_TILE
    assert "std::vector<float> part((size_t)B * Hkv * splits * G * (D + 2))" in cpp


def test_the_snapshot_examples_hold(snap):
    result = doctest.testmod(snap)
    assert result.attempted >= 3 and result.failed == 0
