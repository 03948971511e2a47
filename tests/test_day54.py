"""Day 54's snapshot against the package: the references, the fused forward, the small-M
weight layout and the rule that chooses it.

The references and the dataflow need no C++; the rows that call ``torch.ops.nanoserve`` skip
with the loader's reason where the ops cannot be built.
"""

from __future__ import annotations

import pytest
import torch

from chapters.common import SHIPPED
from chapters.day01_llama_forward.snapshot.weights import load_model as day1_model
from chapters.day54_fused_cpu_ops.snapshot import reference_ops as snap
from chapters.day54_fused_cpu_ops.snapshot import small_gemm as snap_gemm
from chapters.day54_fused_cpu_ops.snapshot.fused import fused_forward as snap_forward
from nanoserve.cpu import csrc
from nanoserve.cpu.csrc import reference as live

DTYPES = (torch.float32, torch.bfloat16)


def needs_ops():
    why = csrc.load()
    if why:
        pytest.skip(why)
    return torch.ops.nanoserve


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_frozen_references_are_the_packages(dtype):
    g = torch.Generator().manual_seed(54)
    x, res = (torch.randn(5, 96, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(96, generator=g).to(dtype)
    assert torch.equal(snap.rms_norm_reference(x, w, 1e-5), live.rms_norm_reference(x, w, 1e-5))
    for a, b in zip(snap.fused_add_rms_norm_reference(x, res, w, 1e-6),
                    live.fused_add_rms_norm_reference(x, res, w, 1e-6), strict=True):
        assert torch.equal(a, b)
    gu = torch.randn(5, 2 * 40, generator=g).to(dtype)
    assert torch.equal(snap.silu_and_mul_reference(gu), live.silu_and_mul_reference(gu))
    q = torch.randn(5, 6, 32, generator=g).to(dtype)
    cos, sin = (torch.randn(5, 32, generator=g).to(dtype) for _ in range(2))
    assert torch.equal(snap.rope_reference(q, cos, sin), live.rope_reference(q, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_fused_dataflow_over_the_references_is_day1s_forward(dtype):
    """The rewrite around the residual stream changes no bit, before any C++ is involved."""
    model = day1_model(SHIPPED, dtype)
    ids = torch.randint(2, 2000, (3, 11), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(11)[None].expand(3, 11)
    with torch.inference_mode():
        assert torch.equal(snap_forward(model, ids, pos), model(ids, pos))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_frozen_forward_over_the_ops_is_the_packages(dtype):
    from nanoserve.cpu.fused import fused_forward
    from nanoserve.model.weights import load_model

    ops = needs_ops()
    model = load_model(SHIPPED, dtype)
    ids = torch.randint(2, 2000, (3, 11), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(11)[None].expand(3, 11)
    with torch.inference_mode():
        assert torch.equal(snap_forward(model, ids, pos, ops=ops),
                           fused_forward(model, ids, pos))


@pytest.mark.parametrize("n,k", [(64, 8), (40, 7), (960, 576), (1, 2)])
def test_the_packed_layout_is_the_snapshots(n, k):
    ops = needs_ops()
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)).bfloat16()
    assert torch.equal(ops.pack_small_gemm(w), snap_gemm.pack(w))


@pytest.mark.parametrize("ratios", [
    {1: 2.0, 2: 1.7, 4: 0.9, 8: 0.5},
    {1: 0.7, 2: 0.6, 4: 0.4, 8: 0.4},
    {1: 5.0, 2: 4.9, 4: 4.5, 8: 2.4},
    {1: 1.5, 2: 0.9, 4: 1.2, 8: 1.1},  # a loss at 2 rows: later wins do not count
])
def test_the_packages_choice_follows_the_frozen_rule(ratios, monkeypatch, tmp_path):
    from nanoserve.cpu import small_gemm

    monkeypatch.setattr(small_gemm, "unavailable", lambda dtype=None: None)
    monkeypatch.setattr(small_gemm, "measure", lambda N, K, dtype, vs, rows=small_gemm.ROWS, *_:
                        {m: ratios.get(m, 1.0) for m in rows})  # 64 rows: a tie
    monkeypatch.setattr(small_gemm, "cache_path", lambda: tmp_path / "small_gemm.json")
    assert small_gemm.choose(128, 64, torch.bfloat16, "linear") == snap_gemm.small_rows(ratios)
    assert small_gemm.choose(128, 63, torch.bfloat16, "linear") == 0  # odd K: never in bf16


@pytest.mark.parametrize("ratios,live,frozen", [
    ({1: 1.0, 2: 2.0, 4: 2.0, 8: 2.0}, 8, 0),  # a tie first: the frozen rule stops, live goes on
    ({1: 1.3, 2: 1.2, 4: 1.0, 8: 1.3}, 8, 2),  # SmolLM2's float32 gate_up, roughly
    ({1: 1.05, 2: 1.05, 4: 1.0, 8: 0.95}, 0, 2),  # never a clear win: oneDNN, the default
])
def test_the_live_rule_lets_a_tie_pass_and_wants_a_clear_win(ratios, live, frozen, monkeypatch,
                                                              tmp_path):
    from nanoserve.cpu import small_gemm

    monkeypatch.setattr(small_gemm, "unavailable", lambda dtype=None: None)
    monkeypatch.setattr(small_gemm, "measure", lambda N, K, dtype, vs, rows=small_gemm.ROWS, *_:
                        {m: ratios.get(m, 1.0) for m in rows})  # 64 rows: a tie
    monkeypatch.setattr(small_gemm, "cache_path", lambda: tmp_path / "small_gemm.json")
    live_rows = small_gemm.choose(128, 64, torch.bfloat16, "linear")
    assert (live_rows, snap_gemm.small_rows(ratios)) == (live, frozen)


def test_the_frozen_small_gemm_reference_matches_the_kernel_within_a_step():
    ops = needs_ops()
    if not ops.small_gemm_available():
        pytest.skip("the C++ ops were built without AVX512-BF16 or AVX2 with FMA")
    g = torch.Generator().manual_seed(3)
    w = torch.randn(100, 64, generator=g).bfloat16()
    b = torch.randn(100, generator=g).bfloat16()
    for m in (1, 3, 8):
        x = torch.randn(m, 64, generator=g).bfloat16()
        out = torch.empty(m, 100, dtype=torch.bfloat16)
        ops.small_gemm(out, x, ops.pack_small_gemm(w), b)
        want = snap_gemm.small_gemm_reference(x, w, b)
        step = 2.0 ** (torch.frexp(want.float().abs().max())[1] - 8)
        assert (out.float() - want.float()).abs().max() <= step
