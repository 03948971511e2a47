"""The decode layer loop as one C++ op over quantized weights (csrc/decode_layers_quant.cpp)
against fused.py's own loop on the same model.

The op calls the kernels QuantKernelLinear calls at decode size (``quant_gemm``, ``int8_gemm``)
with the same arguments, between the same norms, RoPE and attention in the same order, so the
logits must be equal to the bit: float32 and bf16, int4 and int8, symmetric and asymmetric,
W8A8, and a model with a sliding-window layer. Where a linear cannot take the op (act order, a
stand-in kernel's layout, a batch past the kernel's rows) the Python loop runs, and the tokens
do not move. The kernels' own arithmetic is their own tests'; speed is ``bench quant``'s.
"""

from __future__ import annotations

import pytest
import torch
from quant_checkpoints import write_quantized_checkpoint

from nanoserve import LLM, SamplingParams
from nanoserve.cpu import fused, quant_gemm
from nanoserve.layers import linear_quant

pytestmark = pytest.mark.skipif(quant_gemm.unavailable(4, torch.float32) is not None,
                                reason="the C++ quantized kernels are not built here")

PROMPTS = [[1, *range(5 + i, 20 + 3 * i)] for i in range(4)]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SOURCES = {  # id -> (family, testing.CONFIGS name, overrides)
    "llama": ("llama", "gqa", {}),
    "bias": ("llama", "bias", {}),
    "mistral-window": ("mistral", "gqa", {"sliding_window": 5}),
}
SCHEMES = {  # id -> (scheme, group size, symmetric)
    "w4a16-g32-sym": ("w4a16", 32, True),
    "w4a16-g32-asym": ("w4a16", 32, False),
    "w8a16-g32-sym": ("w8a16", 32, True),
    "w8a16-channel-asym": ("w8a16", None, False),
    "w8a8": ("w8a8", None, True),
}
CASES = [("llama", s) for s in SCHEMES] + [("bias", "w4a16-g32-asym"),
                                           ("mistral-window", "w4a16-g32-asym")]


@pytest.fixture(scope="module")
def quantized(hf_checkpoint, tmp_path_factory):
    cache = {}

    def make(source: str, scheme: str):
        if (source, scheme) not in cache:
            family, name, kw = SOURCES[source]
            out = tmp_path_factory.mktemp(f"{source}-{scheme}")
            src = hf_checkpoint(name, family=family, **kw)
            cache[source, scheme] = write_quantized_checkpoint(src, out, *SCHEMES[scheme])[0]
        return cache[source, scheme]
    return make


@pytest.fixture
def kernel_rows(monkeypatch):
    """Every quantized shape takes the kernel up to ``rows`` rows, whatever its timing says here
    (8 unless a test sets it)."""
    rows = {"n": 8}
    monkeypatch.setattr(quant_gemm, "choose", lambda N, K, bits, gs, dtype: rows["n"])
    monkeypatch.setattr(linear_quant, "choose_int8", lambda N, K, dtype: rows["n"])  # W8A8
    return rows


def _run(llm, loop: bool, monkeypatch, params=None) -> tuple[list, list, int, int]:
    """Tokens, every logits tensor, and the numbers of decode steps the op ran and declined."""
    logits, calls = [], []
    real_logits = type(llm.model).compute_logits.__get__(llm.model)
    real_loop = fused._decode_layers
    monkeypatch.setattr(llm.model, "compute_logits",
                        lambda h: logits.append(real_logits(h)) or logits[-1])
    monkeypatch.setattr(fused, "_decode_layers",
                        (lambda *a: calls.append(real_loop(*a)) or calls[-1]) if loop
                        else (lambda *a: None))
    tokens = [o.token_ids for o in llm.generate(PROMPTS, params or [PARAMS] * len(PROMPTS))]
    monkeypatch.setattr(fused, "_decode_layers", real_loop)
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks
    ran = sum(c is not None for c in calls)
    return tokens, logits, ran, len(calls) - ran


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("source,scheme", CASES)
def test_the_op_is_the_python_loop_to_the_bit(quantized, kernel_rows, monkeypatch, source,
                                              scheme, dtype):
    llm = LLM(str(quantized(source, scheme)), dtype=dtype, skip_tokenizer_init=True,
              max_num_seqs=4, max_model_len=96)
    weights = llm.model.decode_layer_weights
    assert weights is not None and weights["quant"] and weights["rows"] == 8
    assert (weights["windows"] is not None) == (source == "mistral-window")
    want, want_logits, none, _ = _run(llm, False, monkeypatch)
    got, got_logits, steps, _ = _run(llm, True, monkeypatch)
    assert none == 0 and steps > 0  # the op ran the decode steps
    assert got == want
    assert len(got_logits) == len(want_logits)
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))


def test_a_batch_past_the_kernels_rows_runs_the_python_loop(quantized, kernel_rows,
                                                            monkeypatch):
    kernel_rows["n"] = 2
    llm = LLM(str(quantized("llama", "w4a16-g32-asym")), dtype="bfloat16",
              skip_tokenizer_init=True, max_num_seqs=4, max_model_len=96)
    assert llm.model.decode_layer_weights["rows"] == 2
    # four rows decode together, then two once the short ones are done
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 3, 9, 9)]
    want = _run(llm, False, monkeypatch, params)[0]
    got, _, steps, declined = _run(llm, True, monkeypatch, params)
    assert got == want
    assert steps > 0 and declined > 0  # 2 rows took the op; 4 rows did not


def test_act_order_and_the_reference_method_never_take_the_op(quantized, kernel_rows):
    from dataclasses import replace

    from nanoserve.layers.linear_methods import use_method
    from nanoserve.layers.linear_quant import quantized_linears

    llm = LLM(str(quantized("llama", "w4a16-g32-sym")), dtype="float32",
              skip_tokenizer_init=True, max_num_seqs=2, max_model_len=64)
    model = llm.model
    assert fused.layer_weights(model) is not None
    method = quantized_linears(model)[0].method
    perm = torch.arange(method.qw.shape[1])
    method.qw = replace(method.qw, perm=perm)
    assert fused.layer_weights(model) is None  # its input would be gathered first
    method.qw = replace(method.qw, perm=None)
    use_method(model, "quant_reference")
    assert fused.layer_weights(model) is None


def test_mismatched_lists_are_refused():
    h = torch.zeros(1, 8)
    pools = torch.zeros(1, 16, 1, 8)
    one, four = [torch.ones(8)], [torch.zeros(1, 1, 1)] * 4
    args = (torch.ones(1, 8), torch.zeros(1, 8), pools, pools.clone(), torch.zeros(1).long(),
            torch.zeros(1, 1).long(), torch.ones(1).long(), 16, 1, 1, 4, 1e-6, 1.0)
    op = torch.ops.nanoserve.decode_layers_quant
    with pytest.raises(RuntimeError, match="4 entries per layer"):
        op(h, h.clone(), one, one, four[:3], four, [None] * 4, [None] * 4, [4] * 4, [32] * 4,
           [0] * 4, *args)
    with pytest.raises(RuntimeError, match="bits 4 and act_bits 8"):
        op(h, h.clone(), one, one, four, four, [None] * 4, [None] * 4, [4] * 4, [32] * 4,
           [0, 0, 8, 0], *args)
