"""The quantized linears' C++ kernels (csrc/quant_gemm.cpp, csrc/int8_gemm.cpp) against
references they did not write: ``QuantizedWeight.dequantize`` then ``F.linear`` for the
weight-only kernels, ``rtn.fake_quantize_per_token`` then ``F.linear`` for W8A8, over random
shapes, group sizes, zero points, dtypes and biases, in every instruction set built here.

Tolerance (float32): the kernel sums group by group and applies each scale once, the reference
sums dequantized products; both are float32 sums of K terms, each within K * 2^-24 of the exact
value relative to ``mag = sum_k |x_k| (|q_k| + |zero|) |scale| + |bias|`` (the kernel sums x q
and x zero apart), so the two are held to ``2 (K + 8) 2^-24 mag``. bf16 results round that once
more: half a bf16 step, at most 2^-8 of the value, on top. ``dequantize_into`` is exact (the
same float32 operations).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoserve.cpu import csrc
from nanoserve.cpu import quant_gemm as qg
from nanoserve.quantization.rtn import fake_quantize_per_token
from nanoserve.quantization.weight import QuantizedWeight

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
EPS = 2.0 ** -24


@pytest.fixture(scope="module", autouse=True)
def built():
    why = qg.unavailable(4, torch.float32)
    if why:
        pytest.skip(why)


def ISAS():
    return qg.isas()


def close(got: torch.Tensor, want: torch.Tensor, mag: torch.Tensor, K: int) -> None:
    tol = 2 * (K + 8) * EPS * mag
    if got.dtype == torch.bfloat16:
        tol = tol + 2.0 ** -8 * want.abs()
    err = (got.float() - want).abs()
    assert bool((err <= tol + 1e-30).all()), (
        f"max error {err.max():.3g}, where the bound is {tol.flatten()[err.argmax()]:.3g}")


def magnitude(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """sum_k |x_k| (|q_k| + |zero|) |scale|: the size of the terms the kernel adds (it sums x q
    and x zero apart), (M, N)."""
    gs = qw.group_size
    zq = 0 if qw.zero is None else qw.zero.float().abs().repeat_interleave(gs, 1)
    wabs = (qw.q.float().abs() + zq) * qw.scale.float().repeat_interleave(gs, 1)
    return x.float().abs() @ wabs.t()


def random_weight(g, N, K, bits, group_size, zero_points):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    G = K // group_size
    q = torch.randint(lo, hi + 1, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, G, generator=g) * 0.1 + 1e-3
    zero = (torch.randint(lo, hi + 1, (N, G), generator=g, dtype=torch.int8)
            if zero_points else None)
    return QuantizedWeight(q, scale, zero, bits, group_size).check("test")


@SETTINGS
@given(M=st.integers(1, 17), N=st.integers(1, 80), groups=st.integers(1, 4),
       group=st.sampled_from([32, 64, 128, "K"]), bits=st.sampled_from([4, 8]),
       zero_points=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       bias=st.booleans(),
       scales=st.sampled_from(["float32", "bfloat16", "packed float32", "packed bfloat16"]),
       seed=st.integers(0, 2**16))
def test_weight_only_equals_dequantize_then_linear(M, N, groups, group, bits, zero_points,
                                                   dtype, bias, scales, seed):
    g = torch.Generator().manual_seed(seed)
    if group == "K":  # one group per output feature; int4 needs a multiple of 8 inputs
        K = 8 * int(torch.randint(1, 40, (1,), generator=g))
        gs = K
    else:
        gs, K = group, group * groups
    qw = random_weight(g, N, K, bits, gs, zero_points)
    if scales.endswith("bfloat16"):
        qw = qw.to(scale_dtype=torch.bfloat16)
    x = torch.randn(M, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    w = qw.dequantize(torch.float32)  # (N, K)
    want = F.linear(x.float(), w, None if b is None else b.float())
    mag = magnitude(x, qw) + (0 if b is None else b.float().abs())
    packed = qg.pack(qw.q, bits)
    scale, zero = qw.scale, qw.zero
    if scales.startswith("packed"):
        scale, zero = qg.pack_scales(scale, zero)
    for isa in ISAS():
        got = qg.gemm(x, packed, scale, zero, bits, gs, b, N, isa)
        assert got.shape == (M, N) and got.dtype == dtype
        close(got, want, mag, K)
    buf = torch.empty(N, K)
    assert torch.equal(qg.dequantize_into(buf, packed, scale, zero, bits, gs), w)


@settings(max_examples=10, deadline=None)
@given(bits=st.sampled_from([4, 8]), zero_points=st.booleans(), seed=st.integers(0, 2**16))
def test_the_csrc_reference_and_packed_scales_agree(bits, zero_points, seed):
    """csrc/reference.py's dequantization is QuantizedWeight's, and (N, G) scales and
    pack_scales' copies give the same bits (the same float32 operations)."""
    from nanoserve.cpu.csrc import reference

    g = torch.Generator().manual_seed(seed)
    qw = random_weight(g, 40, 64, bits, 32, zero_points)
    assert torch.equal(reference.dequantize_reference(qw.q, qw.scale, qw.zero, 32),
                       qw.dequantize(torch.float32))
    x = torch.randn(5, 64, generator=g)
    packed = qg.pack(qw.q, bits)
    for scale in (qw.scale, qw.scale.to(torch.bfloat16)):
        s, z = qg.pack_scales(scale, qw.zero)
        assert s.dtype == scale.dtype
        for isa in ISAS():
            a = qg.gemm(x, packed, scale, qw.zero, bits, 32, None, 40, isa)
            assert torch.equal(a, qg.gemm(x, packed, s, z, bits, 32, None, 40, isa))
    bf = torch.empty(40, 64, dtype=torch.bfloat16)
    assert torch.equal(qg.dequantize_into(bf, packed, qw.scale, qw.zero, bits, 32),
                       qw.dequantize(torch.float32).to(torch.bfloat16))


@SETTINGS
@given(M=st.sampled_from([1, 2, 3, 5, 8, 9, 17, 40]), N=st.integers(1, 80),
       K=st.integers(1, 200), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       bias=st.booleans(), scale_x=st.sampled_from([1e-3, 1.0, 50.0]),
       seed=st.integers(0, 2**16))
def test_w8a8_equals_fake_quantization_then_linear(M, N, K, dtype, bias, scale_x, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    ws = torch.rand(N, generator=g) * 0.01 + 1e-4
    x = (torch.randn(M, K, generator=g) * scale_x).to(dtype)
    if M > 2:
        x[1] = 0  # a zero row: scale 1, all zeros
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    xq = fake_quantize_per_token(x.float())
    w = q.float() * ws[:, None]
    want = F.linear(xq, w, None if b is None else b.float())
    mag = xq.abs() @ w.abs().t() + (0 if b is None else b.float().abs())
    packed = qg.pack_int8(q)
    for isa in ISAS():
        close(qg.int8_gemm(x, packed, ws, b, N, isa), want, mag, K)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_with_odd_groups_takes_the_float_path(dtype):
    """bf16 rows pair inputs for the dot products; an odd group size cannot, and falls back to
    the float32 path: the same answer."""
    g = torch.Generator().manual_seed(3)
    qw = random_weight(g, 45, 63, 8, 7, True)
    x = torch.randn(6, 63, generator=g).to(dtype)
    want = F.linear(x.float(), qw.dequantize(torch.float32))
    for isa in ISAS():
        close(qg.gemm(x, qg.pack(qw.q, 8), qw.scale, qw.zero, 8, 7, None, 45, isa), want,
              magnitude(x, qw), 63)


def test_w8a8_rounds_activations_as_quantize_per_token():
    """Against an identity weight the kernel returns its own quantized rows: bit for bit the
    reference's, ties (x / scale exactly half-way) rounded to even included."""
    K = 64
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, K, generator=g) * 3
    x[2, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1: .5 ties
    x[3] = 0
    eye = qg.pack_int8(torch.eye(K, dtype=torch.int8))
    for isa in ISAS():
        got = qg.int8_gemm(x, eye, torch.ones(K), None, K, isa)
        assert torch.equal(got, fake_quantize_per_token(x))


def test_refusals_are_value_errors_naming_what_is_wrong():
    q = torch.zeros(32, 64, dtype=torch.int8)
    p4, p8 = qg.pack(q, 4), qg.pack(q, 8)
    s = torch.ones(32, 2)
    x = torch.randn(2, 64)
    cases = [
        (lambda: qg.gemm(x, p4, torch.ones(32, 3), None, 4, 24, None, 32), "group_size 24"),
        (lambda: qg.gemm(torch.randn(2, 60), p4, s, None, 4, 40, None, 32), "does not divide"),
        (lambda: qg.gemm(torch.randn(2, 60), p4, s, None, 4, 30, None, 32), "multiple of 8"),
        (lambda: qg.gemm(x.half(), p4, s, None, 4, 32, None, 32), "float32 or bfloat16"),
        (lambda: qg.gemm(x, p8, s, None, 4, 32, None, 32), "4-bit layout"),
        (lambda: qg.gemm(x, p4, torch.ones(32, 3), None, 4, 32, None, 32), "scale must be"),
        (lambda: qg.gemm(x, p4, s, torch.zeros(32, 2), 4, 32, None, 32), "zero must be"),
        (lambda: qg.gemm(x, p4, s, None, 4, 32, None, 33), "out must be"),
        (lambda: qg.gemm(x, p4, s, None, 4, 32, None, 32, "sse"), "isa 'sse'"),
        (lambda: qg.pack(torch.full((4, 8), 9, dtype=torch.int8), 4), "[-8, 7]"),
        (lambda: qg.pack(torch.zeros(4, 12, dtype=torch.int8), 4), "multiple of 8"),
        (lambda: qg.int8_gemm(x, p8, torch.ones(32), None, 32), "pack_int8_weight"),
        (lambda: qg.int8_gemm(x, qg.pack_int8(q), torch.ones(31), None, 32), "w_scale"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            call()


def test_shapes_and_availability_are_said_plainly():
    assert qg.unavailable(3, torch.float32) and qg.unavailable(4, torch.float16)
    assert qg.shape_unsupported(576, 4, 32) is None
    assert "does not divide" in qg.shape_unsupported(100, 8, 32)
    assert "multiple of 8" in qg.shape_unsupported(60, 4, 12)
    assert set(ISAS()) <= {"avx512", "avx2"} and ISAS()
    assert csrc.loaded()
