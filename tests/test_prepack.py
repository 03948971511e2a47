"""Pre-packed oneDNN weights (``nanoserve.layers.linear_methods``) against plain ``F.linear``.

bf16 on a CPU packs by default, so it must be bit-identical there; float32 packs only when asked
and is held to greedy-token identity and a tight logit bound. The choice is a refusal, never a
silent fallback, when ``prepack=True`` cannot be honoured.
"""

from __future__ import annotations

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.cpu.onednn import resolve, unavailable
from nanoserve.layers.linear import PLAIN, OpaqueLinearMethod
from nanoserve.layers.linear_methods import linears, prepack_model
from nanoserve.layers.linear_onednn import OneDNNLinear, packed_layer
from nanoserve.layers.linear_small_m import SmallMLinear
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(unavailable(CPU, torch.float32) is not None,
                                reason=str(unavailable(CPU, torch.float32)))


def _logits(model, ids):
    with torch.inference_mode():
        h = model(torch.tensor([ids]), torch.arange(len(ids))[None])  # (1, T, E)
        return model.compute_logits(h[0])  # (T, V)


@pytest.mark.parametrize("name", ["gqa", "tied", "bias"])
def test_bf16_packed_logits_are_bit_identical(hf_checkpoint, name):
    if unavailable(CPU, torch.bfloat16):
        pytest.skip(unavailable(CPU, torch.bfloat16))
    plain = load_model(hf_checkpoint(name), "bfloat16")
    packed = load_model(hf_checkpoint(name), "bfloat16")
    n = prepack_model(packed)
    assert n == 4 * plain.cfg.num_hidden_layers + 1  # qkv, o, gate_up, down per layer; the head
    assert isinstance(packed.layers[0].mlp.down_proj.method, OneDNNLinear)
    ids = list(range(3, 40))
    assert torch.equal(_logits(plain, ids), _logits(packed, ids))


@pytest.mark.parametrize("name", ["gqa", "bias"])
def test_float32_packed_logits_stay_close(hf_checkpoint, name):
    plain = load_model(hf_checkpoint(name), "float32")
    packed = load_model(hf_checkpoint(name), "float32")
    prepack_model(packed)
    ids = list(range(3, 40))
    assert relative_logit_error(_logits(packed, ids), _logits(plain, ids)) < 1e-5


def test_greedy_tokens_identical_with_and_without_packing():
    prompts = ["The for statement", "def main():", "import os\nimport", "A list is"]
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    out = {}
    for prepack in (True, False):
        llm = LLM(dtype="float32", prepack=prepack, max_num_seqs=4)
        assert llm.prepacked is prepack
        out[prepack] = [o.token_ids for o in llm.generate(prompts, sp)]
    assert out[True] == out[False]


def test_auto_packs_bf16_on_a_cpu_and_float32_where_measured_faster():
    bf16_ok = unavailable(CPU, torch.bfloat16) is None
    assert resolve("auto", CPU, torch.bfloat16, compile=False)[0] is bf16_ok
    pack, why = resolve("auto", CPU, torch.float32, compile=False, shape=(64, 172))
    fp32_why_not = unavailable(CPU, torch.float32)
    assert (pack, why) == (False, fp32_why_not) if fp32_why_not else "measured here" in why
    assert resolve("auto", CPU, torch.bfloat16, compile=True)[0] is bf16_ok  # an opaque op
    assert resolve("auto", torch.device("cuda"), torch.bfloat16, compile=False)[0] is False
    assert resolve(False, CPU, torch.bfloat16, compile=False) == (False, "prepack=False")


@pytest.mark.parametrize("args, problem", [
    (("yes", CPU, torch.float32, False), "choose one of"),
    ((True, torch.device("cuda"), torch.float32, False), "CPU path"),
    ((True, CPU, torch.float16, False), "not torch.float16"),
])
def test_impossible_requests_are_refused(args, problem):
    with pytest.raises(ValueError, match=problem):
        resolve(*args)


def test_packing_twice_is_refused(hf_checkpoint):
    model = load_model(hf_checkpoint("gqa"), "float32")
    prepack_model(model)
    with pytest.raises(ValueError, match="already packed"):
        prepack_model(model)


def test_the_compiled_decode_keeps_packed_weights_and_the_tokens(hf_checkpoint):
    """Under compile each packed linear is one opaque op naming its weight by a handle."""
    from nanoserve import LLM, SamplingParams

    kw = dict(dtype="float32", prepack=True, skip_tokenizer_init=True, max_num_seqs=4)
    prompts = [[0, *range(3, 9 + 2 * i)] for i in range(4)]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    eager = LLM(hf_checkpoint("gqa"), **kw)
    compiled = LLM(hf_checkpoint("gqa"), compile="aot_eager", **kw)
    assert compiled.prepacked and isinstance(compiled.model.layers[0].mlp.down_proj.method,
                                             OpaqueLinearMethod)
    want = [o.token_ids for o in eager.generate(prompts, sp)]
    assert [o.token_ids for o in compiled.generate(prompts, sp)] == want
    assert compiled.engine.compiled.compiles >= 1


def test_float32_packs_only_at_the_measured_margin_and_the_verdict_is_kept(tmp_path,
                                                                           monkeypatch):
    import nanoserve.cpu.measured as measured
    import nanoserve.cpu.onednn as onednn

    if unavailable(CPU, torch.float32):
        pytest.skip(unavailable(CPU, torch.float32))

    monkeypatch.setattr(measured, "cache_dir", lambda: tmp_path)
    timed = []

    def fake(gain):
        def measure(hidden, intermediate):
            timed.append((hidden, intermediate))
            return {m: gain for m in onednn.FP32_ROWS}
        return measure

    monkeypatch.setattr(onednn, "measure_float32", fake(1.1))  # below the margin: plain
    pack, why = onednn.resolve("auto", CPU, torch.float32, compile=False, shape=(64, 172))
    assert not pack and "1.10x" in why and "so plain F.linear" in why
    monkeypatch.setattr(onednn, "measure_float32", fake(3.0))
    assert onednn.resolve("auto", CPU, torch.float32, False, shape=(64, 172))[0] is False
    assert timed == [(64, 172)]  # the first verdict is kept for this machine and shape
    pack, why = onednn.resolve("auto", CPU, torch.float32, compile=False, shape=(96, 256))
    assert pack and "3.00x" in why and timed == [(64, 172), (96, 256)]


def test_small_copies_stand_alone_where_onednn_does_not_pack(hf_checkpoint, monkeypatch):
    """An AVX2 CPU's oneDNN has no bf16 kernel, and float32 packing may not pay: then the
    small-M copies hang off linears that run F.linear for larger batches."""
    import nanoserve.cpu.small_gemm as small_gemm

    if small_gemm.unavailable(torch.float32):
        pytest.skip(small_gemm.unavailable(torch.float32))
    plain = load_model(hf_checkpoint("bias"), "float32")
    model = load_model(hf_checkpoint("bias"), "float32")
    with pytest.raises(ValueError, match="nothing to pack"):
        prepack_model(model, small_gemm=False, onednn=False)
    mlp = model.layers[0].mlp
    shapes = {tuple(m.weight.shape) for m in mlp.modules() if isinstance(m, torch.nn.Linear)}
    against = []  # the MLP's shapes take the small kernel for every batch; the rest refuse it
    monkeypatch.setattr(small_gemm, "choose", lambda n, k, dtype, vs: against.append(vs) or (
        small_gemm.ALL_ROWS if (n, k) in shapes else 0))
    n = prepack_model(model, small_gemm=True, onednn=False)
    assert set(against) == {"linear"}  # timed against the linear it replaces
    swapped = [m for m in linears(model) if m.method is not PLAIN]
    assert n == len(swapped) >= 2 * plain.cfg.num_hidden_layers  # the head too if it shares
    assert all((m.out_features, m.in_features) in shapes for m in swapped)  # a shape with one
    down = mlp.down_proj.method
    assert isinstance(down, SmallMLinear) and down.fallback is None  # F.linear beyond
    assert model.layers[0].self_attn.o_proj.method is PLAIN
    ids = list(range(3, 40))
    assert relative_logit_error(_logits(model, ids), _logits(plain, ids)) < 1e-5


def test_a_packed_linear_ignores_autograd_on_its_input():
    """An input that requires grad, with grad mode on (a model called outside inference mode):
    the packed linear has no backward, so it runs on the detached input. Attached, oneDNN chose
    its training primitive, which for a weight its 64-row blocks pad (1376 x 256) ran the
    reference loop on an AVX2 CPU, hundreds of times slower; detached, the result is the
    inference one and carries no grad."""
    w = torch.randn(1376, 256)
    packed = packed_layer(w)
    x = torch.randn(7, 256, requires_grad=True)
    assert torch.is_grad_enabled()
    out = packed(x)
    assert not out.requires_grad
    with torch.inference_mode():
        want = packed(x)
    assert torch.equal(out, want)
    torch.testing.assert_close(out, torch.nn.functional.linear(x.detach(), w), rtol=1e-4,
                               atol=1e-4)


def test_a_method_named_in_the_registry_can_be_given_to_every_linear(hf_checkpoint):
    """``use_method``: the registry's name puts one method on every linear (the head too); the
    plain one is the model as loaded, oneDNN's packed one stays close in float32."""
    from nanoserve.layers.linear_methods import use_method

    plain = load_model(hf_checkpoint("bias"), "float32")
    ids = list(range(3, 40))
    want = _logits(plain, ids)
    n = use_method(plain, "plain")
    assert n == 4 * plain.cfg.num_hidden_layers + 1 and torch.equal(_logits(plain, ids), want)
    packed = load_model(hf_checkpoint("bias"), "float32")
    use_method(packed, "onednn")
    assert all(type(m.method) is OneDNNLinear for m in linears(packed))
    assert relative_logit_error(_logits(packed, ids), want) < 1e-5
    with pytest.raises(ValueError, match="choose one of"):
        use_method(packed, "int4")


def test_a_packed_linear_lets_go_of_its_own_weight(hf_checkpoint):
    """The method holds the only copy a packed layer reads, as the replaced module did: the
    layer's own weight is released (a tied head's, the embedding's, stays), and the model still
    counts every parameter of the checkpoint."""
    for name in ("gqa", "tied"):
        model = load_model(hf_checkpoint(name), "float32")
        n = model.num_parameters()
        prepack_model(model)
        released = [m for m in linears(model) if m.weight is None]
        assert len(released) == len(linears(model)) - (name == "tied")
        assert model.num_parameters() == n
        if name == "tied":
            assert model.lm_head.weight is model.embed_tokens.weight
