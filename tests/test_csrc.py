"""The C++ CPU ops (nanoserve/csrc) against their PyTorch references, over random shapes.

Tolerances per dtype: float32 results may differ from the reference only in the order of a
sum (the norm's sum of squares, attention's dot products), so they are held to 1e-5 absolute on
values of order one; the elementwise bf16 ops round where the reference rounds and must match
it exactly; bf16 attention accumulates in float32 like the reference and may differ by one
bf16 rounding step of the output (2e-2 on values below 2).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nanoserve.cpu import csrc
from nanoserve.layers.rotary import rope_cos_sin, rope_inv_freq

DTYPES = (torch.float32, torch.bfloat16)
ATOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def ops():
    """One build for the whole suite (cached under build/csrc); a failed build fails here."""
    why = csrc.load()
    assert why is None, why
    from nanoserve.cpu.csrc import reference
    return reference


def R():
    from nanoserve.cpu.csrc import reference
    return reference


def test_the_rope_reference_is_the_models_rope():
    """The reference writes the rotation out (the CPU layer imports no model code); it must stay
    the model's own ``apply_rope``, bit for bit."""
    from nanoserve.layers.rotary import apply_rope

    g = torch.Generator().manual_seed(0)
    x, cos, sin = (torch.randn(5, 3, 8, generator=g) for _ in range(3))
    cos, sin = cos[:, 0], sin[:, 0]  # (N, D)
    want = apply_rope(x.transpose(0, 1), cos[None], sin[None]).transpose(0, 1)
    assert torch.equal(R().rope_reference(x, cos, sin), want)


@SETTINGS
@given(rows=st.integers(1, 9), width=st.integers(1, 700), dt=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
@example(rows=3, width=208, dt=torch.bfloat16, seed=2540)  # two output steps apart (see below)
def test_rms_norm_and_its_fused_residual_add_match_hugging_faces_norm(rows, width, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x, res = (torch.randn(rows, width, generator=g).to(dt) for _ in range(2))
    w = torch.randn(width, generator=g).to(dt)
    out = torch.empty_like(x)
    torch.ops.nanoserve.rms_norm(out, x, w, 1e-5)
    # bf16 rounds where the reference rounds, but the sum of squares runs in another order: a
    # normalised value on a rounding boundary may land one bf16 step away (up to 2^-7 of it),
    # and the weight's multiply, rounded again, can carry that to a second step of the output
    # (hypothesis found 1.1484375 against 1.1328125 with a weight of 1.09): within 2^-6.
    tol = dict(atol=1e-5, rtol=1e-5) if dt == torch.float32 else dict(atol=1e-6, rtol=2 ** -6)
    torch.testing.assert_close(out, R().rms_norm_reference(x, w, 1e-5), **tol)
    x2, r2 = x.clone(), res.clone()
    torch.ops.nanoserve.fused_add_rms_norm(x2, r2, w, 1e-5)
    want_x, want_r = R().fused_add_rms_norm_reference(x, res, w, 1e-5)
    torch.testing.assert_close(r2, want_r, atol=0, rtol=0)  # the add rounds like torch's
    torch.testing.assert_close(x2, want_x, **tol)


@SETTINGS
@given(rows=st.integers(1, 9), inter=st.integers(1, 600), dt=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_silu_and_mul_matches_silu_times_up(rows, inter, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, 2 * inter, generator=g)).to(dt)
    out = torch.empty(rows, inter, dtype=dt)
    torch.ops.nanoserve.silu_and_mul(out, x)
    torch.testing.assert_close(out, R().silu_and_mul_reference(x), atol=ATOL[dt] / 10,
                               rtol=1e-5 if dt == torch.float32 else 0)


@SETTINGS
@given(tokens=st.integers(1, 12), head_dim=st.sampled_from([32, 40, 48, 64, 80, 96, 100, 128]),
       hkv=st.integers(1, 4), group=st.integers(1, 8), dt=st.sampled_from(DTYPES),
       llama3=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_rotates_q_and_k_in_place_and_writes_k_v_into_their_cells(
        tokens, head_dim, hkv, group, dt, llama3, seed):
    from nanoserve.config import ModelConfig
    g = torch.Generator().manual_seed(seed)
    hq = hkv * group
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64} if llama3 else None
    cfg = ModelConfig(vocab_size=8, hidden_size=hq * head_dim, intermediate_size=8,
                      num_hidden_layers=1, num_attention_heads=hq, num_key_value_heads=hkv,
                      head_dim=head_dim, rope_scaling=scaling)
    pos = torch.randint(0, 4000, (1, tokens), generator=g)
    cos, sin = rope_cos_sin(rope_inv_freq(cfg), pos, dt)  # (1, 1, N, D): the model's own table
    cos, sin = cos.reshape(tokens, head_dim), sin.reshape(tokens, head_dim)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * head_dim, generator=g).to(dt)  # views, as in
    q, k, v = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], -1)  # the model
    q, k, v = q.view(tokens, hq, head_dim), k.view(tokens, hkv, head_dim), v.view(
        tokens, hkv, head_dim)
    want_q, want_k = R().rope_reference(q, cos, sin), R().rope_reference(k, cos, sin)
    cells = torch.randperm(64, generator=g)[:tokens]
    cells[0] = -1  # a padding token: rotated, never written
    kp, vp = torch.zeros(64, hkv, head_dim, dtype=dt), torch.zeros(64, hkv, head_dim, dtype=dt)
    v_before = v.clone()
    torch.ops.nanoserve.rope_and_cache(q, k, v, cos, sin, kp, vp, cells)
    torch.testing.assert_close(q, want_q, atol=0, rtol=0)
    torch.testing.assert_close(k, want_k, atol=0, rtol=0)
    live = cells >= 0
    assert torch.equal(kp[cells[live]], k[live]) and torch.equal(vp[cells[live]], v_before[live])
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[cells[live]] = False
    assert not kp[untouched].any() and not vp[untouched].any()


@SETTINGS
@given(head_dim=st.sampled_from([32, 48, 64, 72, 96, 128]), hkv=st.integers(1, 3),
       group=st.integers(1, 8), block_size=st.integers(1, 32),
       lens=st.lists(st.integers(1, 2000), min_size=1, max_size=4), dt=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_decode_attention_reads_the_blocks_in_place(head_dim, hkv, group, block_size, lens, dt,
                                                    seed):
    g = torch.Generator().manual_seed(seed)
    B, hq = len(lens), hkv * group
    width = -(-max(lens) // block_size)
    num_blocks = B * width + 3
    kp = torch.randn(num_blocks * block_size, hkv, head_dim, generator=g).to(dt)
    vp = torch.randn(num_blocks * block_size, hkv, head_dim, generator=g).to(dt)
    table = torch.randperm(num_blocks, generator=g)[:B * width].view(B, width).contiguous()
    for b, n in enumerate(lens):  # past a row's end its table says -1, as the engine's does
        table[b, -(-n // block_size):] = -1
    q = torch.randn(B, hq, head_dim, generator=g).to(dt)
    ctx = torch.tensor(lens)
    out = torch.empty_like(q)
    torch.ops.nanoserve.paged_decode_attention(out, q, kp, vp, table, ctx, block_size,
                                               head_dim ** -0.5)
    want = R().decode_attention_reference(q, kp, vp, table, ctx, block_size)
    torch.testing.assert_close(out, want, atol=ATOL[dt], rtol=0)


@given(batch=st.integers(1, 9), vocab=st.integers(1, 3000), extra=st.integers(0, 40),
       fill=st.sampled_from(["random", "zeros", "ones", "sparse"]), seed=st.integers(0, 2**16))
@SETTINGS
def test_apply_token_bitmask_masks_exactly_the_reference_cells(batch, vocab, extra, fill, seed):
    """Random words (and all-zero, all-one and sparse ones), rows in any order, a vocabulary
    that may run past the mask's last word: the op in place equals the reference's copy."""
    g = torch.Generator().manual_seed(seed)
    W = -(-vocab // 32)
    n = int(torch.randint(1, batch + 1, (1,), generator=g))
    rows = torch.randperm(batch, generator=g)[:n]
    words = {"random": torch.randint(-(2**31), 2**31 - 1, (n, W), generator=g,
                                     dtype=torch.int64).to(torch.int32),
             "zeros": torch.zeros(n, W, dtype=torch.int32),
             "ones": torch.full((n, W), -1, dtype=torch.int32),
             "sparse": (torch.rand(n, W, generator=g) < 0.05).to(torch.int32) * 5}[fill]
    logits = torch.randn(batch, vocab + extra, generator=g)
    want = R().apply_token_bitmask_reference(logits, rows, words)
    got = logits.clone()
    torch.ops.nanoserve.apply_token_bitmask(got, rows, words)
    assert torch.equal(got, want)


def test_bad_arguments_are_refused_with_the_reason():
    q = torch.randn(2, 4, 32)
    kp = torch.randn(16, 2, 32)
    table = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="addresses 8 tokens"):
        torch.ops.nanoserve.paged_decode_attention(torch.empty_like(q), q, kp, kp, table,
                                                   torch.tensor([3, 9]), 8, 1.0)
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.nanoserve.paged_decode_attention(torch.empty_like(q), q, kp, kp, table + 5,
                                                   torch.tensor([3, 3]), 8, 1.0)
    with pytest.raises(RuntimeError, match="row 3 is outside"):
        torch.ops.nanoserve.apply_token_bitmask(torch.zeros(3, 64), torch.tensor([3]),
                                                torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        x = torch.randn(2, 8, dtype=torch.float16)
        torch.ops.nanoserve.rms_norm(torch.empty_like(x), x, torch.ones(8, dtype=x.dtype), 1e-5)


def test_the_ops_stay_opaque_under_torch_compile():
    """Fake implementations let the compiler trace through them; the result is the eager one."""
    w = torch.randn(64)

    def f(x, res):
        x, res = x.clone(), res.clone()
        torch.ops.nanoserve.fused_add_rms_norm(x, res, w, 1e-5)
        out = torch.empty(x.shape[0], 32)
        torch.ops.nanoserve.silu_and_mul(out, x)
        return out * 2, res

    x, res = torch.randn(3, 64), torch.randn(3, 64)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, res)
    want = f(x, res)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_build_is_cached_per_cpu_and_source():
    key = csrc.build_key()
    assert len(key) == 12 and key == csrc.build_key()
    assert (csrc.build_dir() / f"nanoserve_ops_{key}" / f"nanoserve_ops_{key}.so").exists()


def _small_gemm(w: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ w (N, K).T + b through the packed small-M kernel, in w's dtype -> (M, N)."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=w.dtype)
    torch.ops.nanoserve.small_gemm(out, x, torch.ops.nanoserve.pack_small_gemm(w), b)
    return out


@SETTINGS
@given(rows=st.integers(1, 12), k_half=st.integers(1, 200), n=st.integers(1, 200),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_small_gemm_matches_a_float32_matmul_rounded_once(rows, k_half, n, bias, seed):
    if not torch.ops.nanoserve.small_gemm_available():
        pytest.skip("this CPU has no AVX512-BF16: the small-M kernel is not built")
    g = torch.Generator().manual_seed(seed)
    K = 2 * k_half
    w = torch.randn(n, K, generator=g).bfloat16()
    x = torch.randn(rows, K, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    out = _small_gemm(w, x, b)
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    # float32 sums in another order, then one bf16 rounding: within 2 bf16 steps of the value
    torch.testing.assert_close(out.float(), want, atol=1e-3 * K ** 0.5, rtol=2 ** -7)


@SETTINGS
@given(rows=st.integers(1, 12), k=st.integers(1, 400), n=st.integers(1, 200),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_small_gemm_float32_matches_a_float64_matmul(rows, k, n, bias, seed):
    if not torch.ops.nanoserve.small_gemm_f32_available():
        pytest.skip("this CPU has no AVX-512F: the float32 small-M kernel is not built")
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(n, k, generator=g), torch.randn(rows, k, generator=g)  # any K, odd too
    b = torch.randn(n, generator=g) if bias else None
    out = _small_gemm(w, x, b)
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    # float32 sums in another order than F.linear's: within float32 rounding of a K-term sum
    torch.testing.assert_close(out.double(), want, atol=1e-6 * k, rtol=1e-5)


def test_small_gemm_refuses_a_weight_packed_in_another_dtype():
    if not (torch.ops.nanoserve.small_gemm_f32_available()
            and torch.ops.nanoserve.small_gemm_available()):
        pytest.skip("needs both small-M kernels")
    packed = torch.ops.nanoserve.pack_small_gemm(torch.randn(40, 64))  # float32 layout
    with pytest.raises(RuntimeError, match="in x's dtype"):
        torch.ops.nanoserve.small_gemm(torch.empty(2, 40, dtype=torch.bfloat16),
                                       torch.randn(2, 64).bfloat16(), packed, None)
    assert packed.shape == (2, 64, 32)  # (N/32 blocks, K, 32): no k-pairs in float32


def test_small_gemm_refuses_a_weight_of_another_shape():
    if not torch.ops.nanoserve.small_gemm_available():
        pytest.skip("this CPU has no AVX512-BF16: the small-M kernel is not built")
    packed = torch.ops.nanoserve.pack_small_gemm(torch.randn(40, 64).bfloat16())
    with pytest.raises(RuntimeError, match="x has K=32"):
        torch.ops.nanoserve.small_gemm(torch.empty(2, 40, dtype=torch.bfloat16),
                                       torch.randn(2, 32).bfloat16(), packed, None)


def test_the_small_gemm_choice_is_measured_once_and_cached(tmp_path, monkeypatch):
    from nanoserve.cpu import onednn, small_gemm
    if small_gemm.unavailable():
        pytest.skip(small_gemm.unavailable())
    # against the linear the engine would run: oneDNN's packed one where it takes bf16 here
    against = "linear" if onednn.unavailable(torch.device("cpu"), torch.bfloat16) else "onednn"
    monkeypatch.setattr(small_gemm, "cache_path", lambda: tmp_path / "small_gemm.json")
    rows = small_gemm.choose(64, 128, torch.bfloat16, against)
    assert rows in (0, *small_gemm.ROWS, *small_gemm.PREFILL_ROWS, small_gemm.ALL_ROWS)
    import json
    (entry,) = json.loads((tmp_path / "small_gemm.json").read_text()).values()
    timed = set(entry[f"{against}_over_small"])
    decode = {"1", "2", "4", "8"}
    assert entry["rows"] == rows and timed in (decode, decode | {"64"}, decode | {"64", "512"})
    monkeypatch.setattr(small_gemm, "measure", lambda *a: pytest.fail("measured twice"))
    assert small_gemm.choose(64, 128, torch.bfloat16, against) == rows


@pytest.mark.parametrize(("at_64", "at_512", "rows"), [
    (2.0, 2.0, "all"), (2.0, 1.05, 64), (1.05, 2.0, 8), (0.5, 2.0, 8)])
def test_float32_has_its_own_small_gemm_verdict(tmp_path, monkeypatch, at_64, at_512, rows):
    from nanoserve.cpu import small_gemm
    if small_gemm.unavailable(torch.float32):
        pytest.skip(small_gemm.unavailable(torch.float32))
    monkeypatch.setattr(small_gemm, "cache_path", lambda: tmp_path / "small_gemm.json")
    seen = []

    def measure(n, k, dtype, against, rows=small_gemm.ROWS, budget_s=None):
        seen.append((dtype, against, rows))
        return {m: {64: at_64, 512: at_512}.get(m, 2.0) for m in rows}
    monkeypatch.setattr(small_gemm, "measure", measure)
    # a clear win at 8 rows is timed at 64, and a win there at 512: winning both takes every
    # batch; a win at 64 alone, batches up to 64; no win at 64, decode batches only
    want = small_gemm.ALL_ROWS if rows == "all" else rows
    assert small_gemm.choose(64, 127, torch.float32, "linear") == want  # odd K: fine in fp32
    assert small_gemm.choose(64, 127, torch.bfloat16, "linear") == 0  # not in bf16 (k-pairs)
    probes = [(m,) for m in small_gemm.PREFILL_ROWS][:1 if at_64 < 1.1 else 2]
    assert seen == [(torch.float32, "linear", small_gemm.ROWS)] + [
        (torch.float32, "linear", p) for p in probes]
    import json
    (key,) = json.loads((tmp_path / "small_gemm.json").read_text())
    assert f"|64x127|margin 1.1|float32|vs linear|prefill 64,512|ops {csrc.build_key()}" in key
    assert small_gemm.unavailable(torch.float16) == "no small-M kernel for torch.float16"
    with pytest.raises(ValueError, match="against='gemv'"):
        small_gemm.choose(64, 128, torch.float32, "gemv")


@SETTINGS
@given(rows=st.integers(1, 9), vocab=st.integers(1, 300), levels=st.integers(1, 5),
       specials=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(
           [float("nan"), float("inf"), float("-inf"), -0.0])), max_size=4),
       seed=st.integers(0, 2**16))
def test_argmax_rows_is_torch_argmax_exactly(rows, vocab, levels, specials, seed):
    from nanoserve.sampling.sampler import greedy

    csrc.load()
    g = torch.Generator().manual_seed(seed)
    # few distinct values, so rows tie often: the first maximal index must win, as in torch
    logits = torch.randint(0, levels, (rows, vocab), generator=g).float()
    for where, value in specials:  # NaN counts as the largest value, inf and -inf as themselves
        logits.view(-1)[where % logits.numel()] = value
    assert torch.equal(greedy(logits), logits.argmax(dim=-1))
    out = torch.empty(rows, dtype=torch.long)
    torch.ops.nanoserve.argmax_rows(out, logits)
    assert torch.equal(out, logits.argmax(dim=-1))


def test_greedy_falls_back_to_torch_where_the_op_does_not_apply():
    from nanoserve.sampling.sampler import greedy

    x = torch.randn(3, 40).bfloat16()  # not float32: torch's argmax
    assert torch.equal(greedy(x), x.argmax(dim=-1))
    t = torch.randn(40, 3).T  # not contiguous
    assert torch.equal(greedy(t), t.argmax(dim=-1))
    with pytest.raises(RuntimeError, match="int64"):
        torch.ops.nanoserve.argmax_rows(torch.empty(3, dtype=torch.int32), torch.randn(3, 4))
