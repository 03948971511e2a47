"""The speed paths against the plain ones they replace.

- packed prefill (one token stream) against the padded rectangle (Day 27) and per-prompt runs;
- the gathered mapping (Day 50) against ``paged_attention_batched_reference``, over ragged
  batches, block sizes 1/4/16, GQA, scattered blocks, resets, joins, holds and moves;
- greedy tokens identical across every combination of prefill policy and attention path, on a
  random HF checkpoint and on the shipped model, under preemption;
- ``dtype="auto"`` on a CPU, and compiled decode (its recompile count bounded by the buckets).
"""

from __future__ import annotations

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.attention.backends.gathered import paged_attention_gathered
from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.attention.selector import workspace_bytes
from nanoserve.engine.engine import Engine
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error


@pytest.fixture(scope="module")
def model(hf_checkpoint):
    return load_model(hf_checkpoint("gqa"), "float32")


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 255, (n,), generator=g).tolist() for n in lengths]


def _alone(model, seq):
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor([seq]), torch.arange(len(seq))[None]))[0]


# ---------------------------------------------------------------- packed prefill


def test_packed_prefill_equals_padded_and_per_prompt(model):
    lengths = [5, 17, 1, 9]
    prompts = _prompts(lengths, seed=1)
    rows = [3, 0, 1, 2]
    got = {}
    for policy in ("packed", "padded"):
        e = Engine(model, 64, 4, 4, 64, prefill=policy)
        for row, n in zip(rows, lengths, strict=True):
            e.grant(row, n + 4)
        with torch.no_grad():
            got[policy] = e.prefill(rows, prompts)  # (4, V)
            nxt = [7, 8, 9, 10]
            got[policy + " decode"] = e.decode(rows, nxt)
        assert e.tokens_computed == sum(lengths) + 4
        assert e.positions_computed == (sum(lengths) if policy == "packed" else 4 * 17) + 4
        assert [e.cache.lengths[r] for r in rows] == [n + 1 for n in lengths]
    for b, p in enumerate(prompts):
        want = _alone(model, p)[-1]
        assert relative_logit_error(got["packed"][b], want) < 1e-5
        assert relative_logit_error(got["padded"][b], want) < 1e-5
        after = _alone(model, p + [7 + b])[-1]
        assert relative_logit_error(got["packed decode"][b], after) < 1e-5


@pytest.mark.parametrize("attention", ["gathered", "reference"])
def test_packed_prefill_onto_cached_rows(model, attention):
    """A packed step whose rows already hold tokens reads their cached context from the pool."""
    first, more = _prompts([6, 11], seed=4), _prompts([3, 5], seed=5)
    e = Engine(model, 64, 4, 2, 64, attention=attention)
    for row in (0, 1):
        e.grant(row, 20)
    with torch.no_grad():
        e.prefill([0, 1], first)
        got = e.prefill([1, 0], [more[1], more[0]])
    assert relative_logit_error(got[0], _alone(model, first[1] + more[1])[-1]) < 1e-5
    assert relative_logit_error(got[1], _alone(model, first[0] + more[0])[-1]) < 1e-5


# ---------------------------------------------------------------- the gathered mapping


def _twin_caches(block_size, rows=5, hkv=2, d=8, max_len=160, seed=0):
    """A reference cache and a gathered one, sharing scrambled block tables."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = rows * -(-max_len // block_size) + 3
    caches = [BatchedPagedKVCache(1, hkv, d, num_blocks, block_size, rows, max_len,
                                  attention=a) for a in ("reference", "gathered")]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    per_row = num_blocks // rows
    for c in caches:
        for r in range(rows):
            c.tables[r].extend(perm[r * per_row:(r + 1) * per_row])
    return caches, g


def _step(caches, g, rows, num_new, hq=8, hold=frozenset()):
    """The same random q/k/v through both caches' attend; returns both outputs."""
    B, T = len(rows), max(num_new)
    hkv, d = caches[0].k.shape[2], caches[0].k.shape[3]
    q, k, v = (torch.randn(B, h, T, d, generator=g) for h in (hq, hkv, hkv))
    outs = []
    for c in caches:
        pos = torch.tensor([[c.lengths[r] + min(t, n - 1) for t in range(T)]
                            for r, n in zip(rows, num_new, strict=True)])
        c.begin_step(rows, num_new, hold)
        outs.append(c.attend(0, q, k, v, pos))
        c.end_step()
    return outs


def _mask_padding(out, num_new):
    for b, n in enumerate(num_new):
        out[b, :, n:] = 0
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_gathered_equals_reference_through_a_ragged_life(block_size):
    caches, g = _twin_caches(block_size, seed=block_size)
    prompt = {0: 37, 1: 3, 2: 70, 4: 1}
    rows = list(prompt)
    a, b = _step(caches, g, rows, list(prompt.values()))  # padded prefill, rectangle read
    assert torch.allclose(_mask_padding(a, list(prompt.values())),
                          _mask_padding(b, list(prompt.values())), atol=1e-6)

    def decode(rows, n=1, hold=frozenset()):
        for _ in range(n):
            ref, got = _step(caches, g, rows, [1] * len(rows), hold=hold)
            assert (got - ref).abs().max() < 1e-5

    decode(rows, 40)  # ragged contexts, 1 to 110 tokens, crossing chunk boundaries
    index = caches[1].backend.index
    assert index.rebuilt_rows == 4 and index.appended_cells == 4 * 39
    for c in caches:  # a reset: row 2 goes, row 3 joins with a prompt, row 2 comes back short
        c.tables[2].extend(list(reversed(c.reset_row(2))))
    _step(caches, g, [3], [9])
    decode([0, 1, 3, 4], 5)
    assert 2 not in {int(r) for r in index.chunk_row[:index.n]}
    _step(caches, g, [2], [2])
    decode([4, 2, 0, 1, 3], 3)  # a different order: chunks name rows, not places
    decode([0, 1], 2)  # rows missing from a step are dropped from the index, then rejoin
    decode([0, 1, 2, 3, 4], 2)
    decode([0, 1, 2], 3, hold=frozenset({1}))  # a held row rewrites its cell in place
    if hasattr(caches[0], "move_row"):
        for c in caches:
            c.reset_row(4)
            c.move_row(3, 4)
        decode([0, 1, 2, 4], 3)
    cells = sum(-(-caches[1].lengths[r] // index.C) for r in (0, 1, 2, 4))
    assert index.n == cells  # nothing stale left behind


def test_gathered_function_matches_reference_for_gqa_and_bf16():
    from nanoserve.attention.reference import paged_attention_batched_reference
    g = torch.Generator().manual_seed(0)
    lens = [1, 5, 33, 64, 2]
    kp, vp = torch.randn(400, 2, 16, generator=g), torch.randn(400, 2, 16, generator=g)
    q = torch.randn(len(lens), 6, 16, generator=g)
    perm = torch.randperm(400, generator=g)
    read = torch.full((len(lens), max(lens)), -1)
    chunks, owner, used = [], [], 0
    for b, n in enumerate(lens):
        read[b, :n] = perm[used:used + n]
        for s in range(0, n, 8):
            c = torch.full((8,), -1)
            piece = perm[used + s:used + min(n, s + 8)]
            c[:len(piece)] = piece
            chunks.append(c)
            owner.append(b)
        used += n
    cells, chunk_b = torch.stack(chunks), torch.tensor(owner)
    ctx = torch.tensor(lens)
    want = paged_attention_batched_reference(q[:, :, None], kp, vp, read, (ctx - 1)[:, None],
                                             ctx)[:, :, 0]
    got = paged_attention_gathered(q, kp, vp, cells, chunk_b)
    assert (got - want).abs().max() < 1e-5
    got16 = paged_attention_gathered(q.bfloat16(), kp.bfloat16(), vp.bfloat16(), cells, chunk_b)
    assert got16.dtype == torch.bfloat16 and (got16.float() - want).abs().max() < 5e-2


def test_workspace_bytes_prices_the_rectangle_against_the_chunks():
    ragged = [2000] + [50] * 31  # one long row and 31 short ones
    args = (9, 3, 64, 2)  # SmolLM2-135M's heads, bf16
    ref, got = workspace_bytes("reference", ragged, *args), workspace_bytes("gathered", ragged,
                                                                           *args)
    assert ref > 10 * got
    even = [512] * 32
    assert workspace_bytes("gathered", even, *args) < 2 * workspace_bytes("reference", even,
                                                                         *args)
    with pytest.raises(ValueError, match="choose"):
        workspace_bytes("paged", ragged, *args)


# ---------------------------------------------------------------- greedy tokens, every path

PATHS = [(p, a) for p in ("packed", "padded") for a in ("gathered", "reference")]


def _tokens(model_dir, prompts, params, **kw):
    llm = LLM(model_dir, dtype="float32", **kw)
    return [o.token_ids for o in llm.generate(prompts, params)], llm.stats


def test_greedy_tokens_identical_across_paths_on_a_random_checkpoint(hf_checkpoint):
    """Cramped pool (preemption by recompute), ragged prompts and budgets, every path."""
    prompts = [[0, *range(3 + i, 8 + i + (5 * i) % 13)] for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True)
              for i in range(6)]
    kw = dict(skip_tokenizer_init=True, block_size=4, max_num_seqs=4, num_kv_blocks=10)
    runs = {(p, a): _tokens(hf_checkpoint("gqa"), prompts, params, prefill=p, attention=a, **kw)
            for p, a in PATHS}
    first = runs[PATHS[0]][0]
    assert all(tokens == first for tokens, _ in runs.values())
    packed, padded = runs["packed", "gathered"][1], runs["padded", "gathered"][1]
    assert packed.preemptions > 0 and packed.preemptions == padded.preemptions
    assert packed.positions_computed == packed.tokens_computed == padded.tokens_computed
    assert padded.positions_computed > padded.tokens_computed


def test_greedy_tokens_identical_across_paths_on_the_shipped_model():
    prompts = ["Once upon a time", "The little cat sat on the", "Hi", "In a small village there "
               "lived an old man who had", "Why"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    kw = dict(block_size=4, max_num_seqs=4, num_kv_blocks=16)
    runs = {(p, a): _tokens(None, prompts, params, prefill=p, attention=a, **kw)
            for p, a in [("packed", "gathered"), ("padded", "reference")]}
    (a, sa), (b, sb) = runs.values()
    assert a == b and sa.preemptions > 0


# ---------------------------------------------------------------- dtype="auto" on a CPU


def fake_measure(ratios: dict[int, float]):
    calls = []

    def measure(hidden, intermediate, kernel=True, onednn=True):
        calls.append((hidden, intermediate))
        return ratios
    return measure, calls


@pytest.mark.parametrize("ratios,expected", [({8: 2.0, 64: 1.5}, torch.bfloat16),
                                             ({8: 1.4, 64: 0.83}, torch.float32),
                                             ({8: 1.05, 64: 1.05}, torch.float32)])
def test_dtype_auto_follows_the_measurement_not_the_flags(monkeypatch, tmp_path, ratios,
                                                          expected):
    """The same flags (AVX512-BF16, no AMX) on two machines that time differently: auto goes
    with the timing; a near-tie (under MARGIN) stays float32; an explicit dtype is as asked."""
    from nanoserve.cpu import auto_dtype, measured
    from nanoserve.model import weights
    monkeypatch.setattr(weights, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setattr(auto_dtype, "cache_path", lambda: tmp_path / "dtype_auto.json")
    measure, calls = fake_measure(ratios)
    monkeypatch.setattr(auto_dtype, "measure", measure)
    dtype, why = weights.choose_dtype("auto", None, "cpu")
    assert dtype == expected and why.startswith("measured here")
    assert weights.choose_dtype("float32", None, "cpu") == (torch.float32, "as asked")
    assert calls == [measured.DEFAULT_SHAPE]


def test_dtype_auto_is_measured_once_per_machine_and_shape(monkeypatch, tmp_path):
    """The verdict is cached under a key naming the CPU model, torch, the thread count and the
    shape: a second load reads it (no new measurement), another shape measures for itself."""
    import json

    from nanoserve.cpu import auto_dtype, csrc
    monkeypatch.setattr(auto_dtype, "cache_path", lambda: tmp_path / "dtype_auto.json")
    measure, calls = fake_measure({8: 3.0, 64: 2.0})
    monkeypatch.setattr(auto_dtype, "measure", measure)
    first = auto_dtype.choose(64, 128)
    assert auto_dtype.choose(64, 128) == first and calls == [(64, 128)]
    auto_dtype.choose(64, 256)
    assert calls == [(64, 128), (64, 256)]
    (key, entry), _ = json.loads((tmp_path / "dtype_auto.json").read_text()).items()
    assert csrc.cpu_model() in key and torch.__version__ in key and "64x128" in key
    assert entry["dtype"] == "bfloat16" and entry["gain"] == pytest.approx(6 ** 0.5, abs=1e-3)
    assert "2.45x" in first[1]


def test_dtype_auto_measures_real_linears():
    """The real measurement on a small shape: a positive ratio at each batch size."""
    from nanoserve.cpu import auto_dtype
    ratios = auto_dtype.measure(64, 128)
    assert set(ratios) == set(auto_dtype.ROWS) and all(r > 0 for r in ratios.values())


def test_dtype_auto_counts_the_small_kernel_where_the_engine_would_run_it(monkeypatch):
    """Each dtype's time is its faster linear: with the C++ ops, the small-M kernel is an arm
    of each dtype beside its plain (or packed) linear, every arm runs, and the ratio takes
    each dtype's best."""
    from nanoserve.cpu import auto_dtype, small_gemm
    if small_gemm.unavailable(torch.float32) or small_gemm.unavailable(torch.bfloat16):
        pytest.skip("no small-M kernel for both dtypes here")
    ran = []

    def best_interleaved(calls, reps, budget):
        ran.append([len(c()) for c in calls])  # every arm runs, over both projections
        return [4.0, 1.0, 8.0, 2.0]  # float32 plain, float32 kernel, bf16 plain, bf16 kernel
    monkeypatch.setattr(auto_dtype, "best_interleaved", best_interleaved)
    assert auto_dtype.measure(64, 128) == {m: 0.5 for m in auto_dtype.ROWS}
    assert ran == [[2, 2, 2, 2]] * len(auto_dtype.ROWS)
    assert auto_dtype.kernel_key().startswith("ops ")


def test_dtype_auto_times_only_the_linears_the_engine_will_run(monkeypatch):
    """kernels=False (or prepack=False) leaves the small-M kernel out of the timing, and
    prepack=False oneDNN's packing too: the verdict is for the engine being built, and its cache
    key says which arms it timed."""
    from nanoserve.cpu import auto_dtype
    ran = []

    def best_interleaved(calls, reps, budget):
        ran.append(len(calls))
        return [1.0] * len(calls)
    monkeypatch.setattr(auto_dtype, "best_interleaved", best_interleaved)
    auto_dtype.measure(64, 128, kernel=False)
    assert ran == [2] * len(auto_dtype.ROWS)  # float32 F.linear and one bf16 linear, no kernel
    assert auto_dtype.kernel_key(kernel=False) == "no small-M kernel"
    assert auto_dtype.kernel_key(onednn=False).endswith("|no oneDNN packing")
    seen = []

    def choose(hidden, intermediate, kernel=True, onednn=True):
        seen.append((kernel, onednn))
        return torch.float32, "measured here (fake)"
    monkeypatch.setattr(auto_dtype, "choose", choose)
    for kw in ({"kernels": False}, {"prepack": False}, {}):
        assert LLM(dtype="auto", **kw).dtype_reason == "measured here (fake)"
    assert seen == [(False, True), (False, False), (True, True)]


def test_dtype_auto_says_what_it_chose(caplog):
    import logging

    from nanoserve.cpu import auto_dtype
    with caplog.at_level(logging.INFO, logger="nanoserve"):
        llm = LLM(dtype="auto")
    mc = llm.config
    assert (llm.dtype, llm.dtype_reason) == auto_dtype.choose(mc.hidden_size, mc.intermediate_size)
    assert str(llm.dtype).removeprefix("torch.") in caplog.text and llm.dtype_reason in caplog.text
    assert llm.dtype_reason.startswith("measured here")
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].token_ids) == 4


def test_bf16_logits_stay_near_transformers(hf_checkpoint):
    """Ours in bf16 against transformers in fp32: within a few times transformers' own bf16
    error. The fp32 parity tests (test_parity.py) keep the exact claim."""
    from nanoserve.testing import load_hf_model
    d = hf_checkpoint("gqa")
    ids = torch.tensor([_prompts([40], seed=7)[0]])
    ref = load_hf_model(d)
    with torch.no_grad():
        want = ref(ids).logits[0]
        hf16 = ref.to(torch.bfloat16)(ids).logits[0]
        ours = load_model(d, "bfloat16")
        got = ours.compute_logits(ours(ids, torch.arange(40)[None]))[0]
    err, hf_err = relative_logit_error(got, want), relative_logit_error(hf16, want)
    assert got.dtype == torch.float32  # the sampler always gets float32
    assert err < 0.05 and err < 3 * hf_err + 1e-3, (err, hf_err)


# ---------------------------------------------------------------- compiled decode (Day 49)

COMPILE_PROMPTS = [[0, *range(3 + i, 6 + 2 * i)] for i in range(6)]
COMPILE_PARAMS = [SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True)
                  for i in range(6)]
COMPILE_KW = dict(skip_tokenizer_init=True, block_size=4, max_num_seqs=4, num_kv_blocks=9)


@pytest.fixture(scope="module")
def compiled_llm(hf_checkpoint):
    """One compiled LLM for the module. aot_eager: dynamo's tracing, guards and buckets without
    inductor's C++ build (that one is the slow test below)."""
    return LLM(hf_checkpoint("gqa"), dtype="float32", compile="aot_eager", **COMPILE_KW)


def test_compiled_decode_gives_the_same_tokens_and_recompiles_per_bucket(compiled_llm,
                                                                          hf_checkpoint):
    got = [o.token_ids for o in compiled_llm.generate(COMPILE_PROMPTS, COMPILE_PARAMS)]
    want, _ = _tokens(hf_checkpoint("gqa"), COMPILE_PROMPTS, COMPILE_PARAMS, **COMPILE_KW)
    assert got == want
    c = compiled_llm.engine.compiled
    assert c.buckets == [1, 2, 4] and 1 <= c.compiles <= len(c.buckets)
    assert 0 < c.calls < compiled_llm.stats.forward_passes  # every decode, never a prefill
    assert compiled_llm.stats.preemptions > 0  # and through preemption by recompute
    before = c.compiles
    again = [o.token_ids for o in compiled_llm.generate(COMPILE_PROMPTS, COMPILE_PARAMS)]
    assert again == want and c.compiles == before  # warm: no bucket compiles twice
    assert c.warmup_s > 0


def test_compiled_engines_in_one_process_keep_their_own_recompile_budget(compiled_llm,
                                                                         hf_checkpoint):
    """Dynamo counts recompiles per code object; each engine has its own copy, so the third
    and fourth compiled engine in a process still compile every bucket they meet."""
    want = [o.token_ids for o in compiled_llm.generate(COMPILE_PROMPTS, COMPILE_PARAMS)]
    for _ in range(3):
        llm = LLM(hf_checkpoint("gqa"), dtype="float32", compile="aot_eager", **COMPILE_KW)
        assert [o.token_ids for o in llm.generate(COMPILE_PROMPTS, COMPILE_PARAMS)] == want
        assert llm.engine.compiled.compiles == compiled_llm.engine.compiled.compiles


@pytest.mark.slow
def test_inductor_decode_matches_eager_in_float32(hf_checkpoint):
    """The real backend: C++ built by inductor (about 30 s a bucket on a loaded 2-core CPU)."""
    kw = dict(COMPILE_KW, max_num_seqs=2)
    llm = LLM(hf_checkpoint("gqa"), dtype="float32", compile=True, **kw)
    got = [o.token_ids for o in llm.generate(COMPILE_PROMPTS[:4], COMPILE_PARAMS[:4])]
    want, _ = _tokens(hf_checkpoint("gqa"), COMPILE_PROMPTS[:4], COMPILE_PARAMS[:4], **kw)
    assert got == want and llm.engine.compiled.compiles <= 2
