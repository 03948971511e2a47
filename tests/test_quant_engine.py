"""The engine on quantized checkpoints: compressed-tensors W8A16, W4A16 and W8A8, served as read.

References the engine did not compute: the dense model on the same weights dequantized (written
beside each quantized checkpoint by ``quant_checkpoints.py``: what the checkpoint stands for)
and the reference linear method (dequantize, then ``F.linear``; W8A8's inputs rounded to int8
per token first). The kernel method is held against the reference with the kernels stood in by
a PyTorch emulation of ``nanoserve.cpu.quant_gemm``'s interface (``fake_kernels``) where the C++
kernels are not built, so that what the method does around a kernel (which batches take it,
act order, W8A8's int8 path, the scratch-buffer fallback beyond its rows) is exercised either
way; the kernels' own arithmetic is their own tests'. Every drain gives every KV block back.
"""

from __future__ import annotations

import json
from dataclasses import replace

import openai
import pytest
import torch
from quant_checkpoints import write_quantized_checkpoint
from safetensors.torch import load_file, save_file

from nanoserve import LLM, SamplingParams
from nanoserve.cpu import quant_gemm
from nanoserve.layers import linear_quant
from nanoserve.layers.linear_methods import use_method
from nanoserve.layers.linear_quant import (
    QuantKernelLinear,
    dequantize_into,
    quantized_linears,
    reference_linear,
)
from nanoserve.quantization.rtn import quantize_per_token, quantize_rtn
from nanoserve.testing import greedy_logits, write_tokenizer

KW = dict(dtype="float32", skip_tokenizer_init=True)
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
FAKE_ROWS = 4  # the emulated kernel's batches; decodes take it, prefills fall back
SOURCES = {  # id -> (family, testing.CONFIGS name, overrides)
    "llama": ("llama", "gqa", {}),
    "qwen3-window": ("qwen3", "head_dim", {"use_sliding_window": True, "sliding_window": 3,
                                           "layer_types": ["sliding_attention",
                                                           "full_attention"]}),
}
SCHEMES = {  # id -> (scheme, group size, symmetric)
    "w8a16-g32-sym": ("w8a16", 32, True),
    "w4a16-g32-asym": ("w4a16", 32, False),
    "w4a16-g32-sym": ("w4a16", 32, True),
    "w8a8": ("w8a8", None, True),
}
FAST = [("llama", "w4a16-g32-asym"), ("llama", "w8a8"), ("qwen3-window", "w8a16-g32-sym")]
SLOW = [(s, q) for s in SOURCES for q in SCHEMES if (s, q) not in FAST]


@pytest.fixture(scope="module")
def quantized(hf_checkpoint, tmp_path_factory):
    """(source id, scheme id) -> (quantized folder, its dequantized dense twin)."""
    cache = {}

    def make(source: str, scheme: str):
        if (source, scheme) not in cache:
            family, name, kw = SOURCES[source]
            src = hf_checkpoint(name, family=family, **kw)
            out = tmp_path_factory.mktemp(f"{source}-{scheme}")
            cache[source, scheme] = write_quantized_checkpoint(src, out, *SCHEMES[scheme])
        return cache[source, scheme]
    return make


@pytest.fixture
def fake_kernels(monkeypatch):
    """``quant_gemm``'s interface in PyTorch: the packed form is q itself, weight-only products
    are dequantize-then-F.linear, W8A8's an exact int32 dot product of int8 activations per
    token; every shape takes batches of up to ``FAKE_ROWS`` rows."""
    def gemm(x, packed, scale, zero, bits, group_size, bias, out_features, isa="auto"):
        assert packed.dtype == torch.int8 and scale.dtype == torch.float32
        q = packed.to(torch.float32).unflatten(1, (scale.shape[1], group_size))
        if zero is not None:
            q = q - zero.to(torch.float32)[..., None]
        w = (q * scale[..., None]).flatten(1).to(x.dtype)
        return torch.nn.functional.linear(x, w, bias)

    def int8_gemm(x, packed, w_scale, bias, out_features, isa="auto"):
        x8, sx = quantize_per_token(x)  # (..., K) int8, (..., 1)
        acc = (x8.to(torch.int64) @ packed.to(torch.int64).t()).to(torch.float32)
        y = (acc * sx * w_scale).to(x.dtype)
        return y if bias is None else y + bias

    for name, fn in dict(unavailable=lambda bits, dtype: None, pack=lambda q, bits: q.clone(),
                         shape_unsupported=lambda K, bits, gs: None,
                         pack_scales=lambda scale, zero: (scale.float(), zero),
                         pack_int8=lambda q: q.clone(), gemm=gemm, int8_gemm=int8_gemm,
                         choose=lambda N, K, bits, gs, dtype: FAKE_ROWS).items():
        monkeypatch.setattr(quant_gemm, name, fn)
    monkeypatch.setattr(linear_quant, "choose_int8", lambda N, K, dtype: FAKE_ROWS)


def drained(llm) -> None:
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks


def tokens(llm, prompts=PROMPTS) -> list[list[int]]:
    out = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    drained(llm)
    return out


def check_kernel_against_reference(folder, rows: int | None = FAKE_ROWS) -> None:
    """Greedy tokens with the kernels (emulated, taking ``rows``; or the C++ ones, ``rows``
    None) equal the reference method's; logits close."""
    llm = LLM(str(folder), **KW)
    model = llm.core.loaded.model
    assert all(isinstance(m.method, QuantKernelLinear) for m in quantized_linears(model))
    described = quantized_linears(model)[0].method.describe()
    assert (f"kernel up to {rows} rows" if rows else "kernel") in described, described
    kernel, kernel_logits = tokens(llm), greedy_logits(llm, PROMPTS[1], 4)
    use_method(model, "quant_reference")
    assert tokens(llm) == kernel
    for a, b in zip(greedy_logits(llm, PROMPTS[1], 4), kernel_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("source,scheme", FAST)
def test_kernel_method_matches_the_reference(quantized, fake_kernels, source, scheme):
    check_kernel_against_reference(quantized(source, scheme)[0])


@pytest.mark.skipif(quant_gemm.unavailable(4, torch.float32) is not None,
                    reason="the C++ quantized kernels are not built here")
@pytest.mark.parametrize("source,scheme", FAST)
def test_cpp_kernels_match_the_reference(quantized, source, scheme):
    """The C++ kernels themselves (their own tests hold each product to the reference's to
    float32 rounding): the engine's greedy tokens with them are the reference method's."""
    check_kernel_against_reference(quantized(source, scheme)[0], rows=None)


@pytest.mark.slow
@pytest.mark.parametrize("source,scheme", SLOW)
def test_kernel_method_matches_the_reference_every_scheme(quantized, fake_kernels, source,
                                                          scheme):
    check_kernel_against_reference(quantized(source, scheme)[0])


def check_reference_against_dense(folder, twin) -> None:
    """The reference method's logits are the dense model's on the dequantized weights (the same
    F.linear on the same float32 values); on the default engine the tokens are too."""
    if "w8a8" in str(folder):  # its reference rounds the activations too: not the dense model
        return
    plain = dict(KW, kernels=False, prepack=False)
    ours, dense = LLM(str(folder), **plain), LLM(str(twin), **plain)
    for a, b in zip(greedy_logits(ours, PROMPTS[1], 4), greedy_logits(dense, PROMPTS[1], 4),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert tokens(LLM(str(folder), **KW)) == tokens(LLM(str(twin), **KW))


@pytest.mark.parametrize("source,scheme", FAST)
def test_reference_is_the_dequantized_dense_model(quantized, source, scheme):
    check_reference_against_dense(*quantized(source, scheme))


@pytest.mark.slow
@pytest.mark.parametrize("source,scheme", SLOW)
def test_reference_is_the_dequantized_dense_model_every_scheme(quantized, source, scheme):
    check_reference_against_dense(*quantized(source, scheme))


def test_the_load_says_what_it_read_and_holds_no_dense_copy(quantized):
    llm = LLM(str(quantized("llama", "w4a16-g32-asym")[0]), **KW)
    assert llm.core.loaded.quantization == ("compressed-tensors w4a16, group 32, asymmetric; "
                                            "14 linears quantized, lm_head dense")
    model = llm.core.loaded.model
    assert len(quantized_linears(model)) == 8  # qkv, o, gate_up, down per layer, fused
    assert all(m.weight is None for m in quantized_linears(model))
    # the head stays dense: a dense method (plain, or the packing this machine measured)
    assert model.lm_head not in quantized_linears(model)
    with pytest.raises(ValueError, match="holds a dense one"):
        QuantKernelLinear.for_layer(model.lm_head)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scratch_dequantization_is_the_references(dtype):
    g = torch.Generator().manual_seed(0)
    for symmetric in (True, False):
        qw = quantize_rtn(torch.randn(48, 96, generator=g), 4, 32, symmetric)
        assert torch.equal(dequantize_into(qw, dtype), qw.dequantize(dtype))


def test_act_order_gathers_the_inputs_first(fake_kernels):
    g = torch.Generator().manual_seed(1)
    qw = replace(quantize_rtn(torch.randn(16, 64, generator=g), 4, 32, False),
                 perm=torch.randperm(64, generator=g))
    method, x = QuantKernelLinear(qw, None, torch.float32), torch.randn(6, 64, generator=g)
    for rows in (2, 6):  # the kernel's batch, then the scratch buffer's
        torch.testing.assert_close(method.run(x[:rows]), reference_linear(qw, x[:rows], None))


def test_without_kernels_the_method_is_the_reference_and_says_why():
    qw = quantize_rtn(torch.randn(16, 64), 4, 32, True)
    why = quant_gemm.unavailable(4, torch.float32)
    if why is None:
        pytest.skip("the quantized kernels run here")
    method = QuantKernelLinear(qw, None, torch.float32)
    assert why in method.describe()
    x = torch.randn(3, 64)
    assert torch.equal(method.run(x), reference_linear(qw, x, None))


# ------------------------------------------------------------- tensor parallelism

@pytest.mark.parametrize("scheme", ["w4a16-g32-asym"])
def test_tp2_is_one_rank(quantized, scheme):
    folder = str(quantized("llama", scheme)[0])
    one = LLM(folder, **KW)
    want, want_logits = tokens(one), greedy_logits(one, PROMPTS[1], 3)
    with LLM(folder, **KW, tensor_parallel_size=2) as two:
        assert tokens(two) == want
        for a, b in zip(greedy_logits(two, PROMPTS[1], 3), want_logits, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tp2_is_one_rank_per_channel(hf_checkpoint, tmp_path):
    """One scale per output feature: each rank keeps it whole over its own inputs."""
    folder = str(write_quantized_checkpoint(hf_checkpoint("gqa"), tmp_path, "w8a16", None)[0])
    want = tokens(LLM(folder, **KW))
    with LLM(folder, **KW, tensor_parallel_size=2) as two:
        assert tokens(two) == want


def test_tp_refuses_groups_the_cut_splits(hf_checkpoint, tmp_path):
    src = hf_checkpoint("gqa")  # o_proj has 64 inputs: 32 per rank, half a group of 64
    folder = write_quantized_checkpoint(src, tmp_path, "w4a16", 64)[0]
    with pytest.raises(ValueError, match=r"o_proj.weight: tensor_parallel_size=2 gives each "
                                         r"rank 32 of its 64 inputs \(K/tp\), which does not "
                                         r"fall on its groups of 64"):
        LLM(str(folder), **KW, tensor_parallel_size=2)


# ------------------------------------------------------------- corrupt checkpoints

LAYER = "model.layers.0.mlp.down_proj"  # (64, 128): 4 groups of 32


def corrupt(folder, tmp_path, edit_tensors=None, edit_config=None):
    """A copy of ``folder`` with its tensors or its config.json edited."""
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_corrupt_checkpoints_are_refused_by_tensor_and_shape(quantized, tmp_path):
    folder = quantized("llama", "w4a16-g32-asym")[0]

    def scale(t):
        t[f"{LAYER}.weight_scale"] = t[f"{LAYER}.weight_scale"][:, :3].contiguous()

    def shape(t):
        t[f"{LAYER}.weight_shape"] = torch.tensor([64, 256])

    def group(c):
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 48

    def rows(t):  # a whole quantized weight of another shape than the model's
        qw = quantize_rtn(torch.randn(32, 128), 4, 32, False)
        from nanoserve.quantization.compressed_tensors_write import layer_tensors
        t.update(layer_tensors(LAYER, qw))

    cases = [(dict(edit_tensors=scale), rf"{LAYER}.weight_scale has shape \(64, 3\); a "
                                        r"\(64, 128\) weight in groups of 32 needs \(64, 4\)"),
             (dict(edit_tensors=shape), rf"{LAYER}.weight_packed has shape \(64, 16\) "
                                        r"torch.int32; weight_shape \[64, 256\]"),
             (dict(edit_config=group), rf"{LAYER}: group_size 48 does not divide the 128 "
                                       r"inputs"),
             (dict(edit_tensors=rows), r"layers.0.mlp.down_proj.weight.*expected \[\(64, "
                                       r"128\)\], found \[\(32, 128\)\]")]
    for i, (edit, message) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        with pytest.raises(ValueError, match=message):
            LLM(corrupt(folder, tmp_path / str(i), **edit), **KW)


# ------------------------------------------------------------- the server

def test_nanoserve_serve_answers_the_openai_client(quantized):
    from nanoserve.bench.local_server import local_server

    folder = quantized("llama", "w4a16-g32-sym")[0]
    write_tokenizer(folder)
    want = LLM(str(folder), dtype="float32").generate(["Hi there"], GREEDY)[0].token_ids
    with local_server(folder, dtype="float32", max_num_seqs=2, timeout_s=120,
                      extra_args=("--max-model-len", "128")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        out = client.completions.create(model=folder.name, prompt="Hi there", max_tokens=10,
                                        temperature=0, extra_body={"ignore_eos": True,
                                                                   "return_token_ids": True})
        assert out.usage.completion_tokens == 10
        assert out.choices[0].token_ids == want
        text = server.log()
    assert server.process.returncode == 0, text[-2000:]
    assert "quantization: compressed-tensors w4a16, group 32, symmetric; 14 linears " \
           "quantized, lm_head dense" in text
