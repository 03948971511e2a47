"""The decode layer loop as one C++ op (csrc/decode_layers.cpp) against fused.py's own loop.

It calls the same functions in the same order, so the logits must be equal to the bit, in
float32 and bf16, on the shipped model and on checkpoints transformers wrote (GQA, tied
embeddings, biases on every projection). It runs only where it qualifies; everywhere else the
Python loop runs and the tokens do not move. Speed is a benchmark (``speedpaths layers``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import nanoserve
from nanoserve import LLM, SamplingParams
from nanoserve.cpu import csrc, fused

pytestmark = pytest.mark.skipif(csrc.load() is not None, reason=str(csrc.load()))

SHIPPED = Path(nanoserve.__file__).parent / "checkpoints" / "nanoserve-tiny"
PROMPTS = [[1, *range(5 + i, 20 + 3 * i)] for i in range(6)]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture
def small_everywhere(monkeypatch):
    """Every packed shape takes the small-M kernel up to 8 rows, whatever its timing says here
    (the test checkpoints' shapes are too small for it to win): the loop then qualifies."""
    from nanoserve.cpu import small_gemm

    monkeypatch.setattr(small_gemm, "choose", lambda N, K, dtype=torch.bfloat16, against="onednn":
                        0 if small_gemm.unavailable(dtype) else 8)


def _run(llm, loop: bool, monkeypatch) -> tuple[list, list, int, int]:
    """Tokens, every logits tensor, and the numbers of decode steps the op ran and declined,
    with or without it."""
    logits, calls = [], []
    real_logits = type(llm.model).compute_logits.__get__(llm.model)  # not an earlier wrapper
    real_loop = fused._decode_layers
    monkeypatch.setattr(llm.model, "compute_logits",
                        lambda h: logits.append(real_logits(h)) or logits[-1])
    monkeypatch.setattr(fused, "_decode_layers",
                        (lambda *a: calls.append(real_loop(*a)) or calls[-1]) if loop
                        else (lambda *a: None))
    tokens = [o.token_ids for o in llm.generate(PROMPTS, [PARAMS] * len(PROMPTS))]
    monkeypatch.setattr(fused, "_decode_layers", real_loop)
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks
    ran = sum(c is not None for c in calls)
    return tokens, logits, ran, len(calls) - ran


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["shipped", "gqa", "tied", "bias"])
def test_the_op_is_the_python_loop_to_the_bit(small_everywhere, monkeypatch, hf_checkpoint,
                                              name, dtype):
    if csrc.load() is None and not torch.ops.nanoserve.small_gemm_f32_available() \
            and dtype == "float32":
        pytest.skip("no float32 small-M kernel on this CPU")
    path = SHIPPED if name == "shipped" else hf_checkpoint(name)
    llm = LLM(str(path), dtype=dtype, skip_tokenizer_init=True, max_num_seqs=4,
              max_model_len=96, prepack="auto")  # oneDNN's packing or not, the small copies
    want, want_logits, none, _ = _run(llm, False, monkeypatch)
    got, got_logits, steps, _ = _run(llm, True, monkeypatch)
    assert none == 0 and steps > 0  # the op ran the decode steps
    assert got == want
    assert len(got_logits) == len(want_logits)
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))


def test_a_batch_past_the_small_kernels_rows_runs_the_python_loop(monkeypatch):
    from nanoserve.cpu import small_gemm

    monkeypatch.setattr(small_gemm, "choose", lambda N, K, dtype=torch.bfloat16, vs="onednn": 2)
    llm = LLM(str(SHIPPED), dtype="bfloat16", skip_tokenizer_init=True, max_num_seqs=4,
              max_model_len=96)
    if llm.model.decode_layer_weights is None:
        pytest.skip("the small-M kernel is not available here")
    want = _run(llm, False, monkeypatch)[0]
    got, _, steps, declined = _run(llm, True, monkeypatch)
    assert got == want
    assert steps > 0 and declined > 0  # 2 rows or fewer took the op; 3 and 4 rows did not
    assert llm.model.decode_layer_weights["rows"] == 2


def test_a_model_without_small_m_copies_never_takes_the_op():
    llm = LLM(str(SHIPPED), dtype="float32", skip_tokenizer_init=True, max_num_seqs=2,
              max_model_len=64, prepack=False)
    assert llm.model.decode_layer_weights is None


def test_mismatched_lists_are_refused():
    h = torch.zeros(1, 8)
    pools = torch.zeros(2, 16, 1, 8)
    one = [torch.ones(8)]
    with pytest.raises(RuntimeError, match="one entry per layer"):
        torch.ops.nanoserve.decode_layers(
            h, h.clone(), one, one * 2, one, [None], one, [None], one, [None], one, [None],
            torch.ones(1, 8), torch.zeros(1, 8), pools, pools.clone(), torch.zeros(1).long(),
            torch.zeros(1, 1).long(), torch.ones(1).long(), 16, 1, 1, 4, 1e-6, 1.0)
