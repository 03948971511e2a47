"""The engine on the C++ ops (fused.py, attention="cpu") against the plain reference path.

float32, greedy: every token identical to ``kernels=False, attention="reference"``, through
preemption (a cramped pool), compaction, chunked prefill with mixed steps, prefix caching, graph
windows in eager replay and the compiled decode, on the shipped model and on checkpoints that
transformers wrote (GQA, tied embeddings, llama3 RoPE scaling, a head_dim that is not
hidden / heads, biases).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.cpu import csrc

PROMPTS = [[0, *range(3 + i, 9 + 3 * i)] for i in range(8)]
PARAMS = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(8)]
KW = dict(dtype="float32", skip_tokenizer_init=True, block_size=4, max_num_seqs=4,
          max_model_len=96)
REFERENCE = dict(kernels=False, attention="reference")


def tokens(model=None, **kw):
    llm = LLM(model, **{**KW, **kw}) if model else LLM(**{**KW, **kw})
    out = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks
    return llm, out


@pytest.fixture(scope="module")
def reference_tokens():
    return tokens(**REFERENCE)[1]


def test_auto_turns_the_ops_and_their_attention_on_and_says_why():
    llm = LLM(**KW)
    assert llm.kernels is True and llm.attention == "cpu"
    assert "C++ CPU ops loaded" in llm.kernels_reason
    assert llm.model.kernels is True


@pytest.mark.parametrize("options", [
    dict(kernels=True, attention="cpu"),
    dict(kernels=True, attention="cpu", num_kv_blocks=14),  # cramped: preemption by recompute
    dict(kernels=True, attention="cpu", compact_rows=True, num_kv_blocks=16),
    dict(kernels=True, attention="cpu", max_num_batched_tokens=8),  # chunks beside decodes
    dict(kernels=True, attention="cpu", enable_prefix_caching=True, max_num_batched_tokens=8),
    dict(kernels=True, attention="cpu", cuda_graphs=True),  # windows, replayed eagerly
    dict(kernels=True, attention="gathered"),
    dict(kernels=False, attention="cpu"),
    dict(kernels=True, prefill="padded", enable_chunked_prefill=False),
    dict(kernels=True, batching="static"),  # held rows: written in place, never grown
    dict(kernels=True, enable_kv_cache=False),  # no backend: causal attention over the prompt
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_kernels_change_no_token(reference_tokens, options):
    llm, got = tokens(**options)
    assert got == reference_tokens
    if options.get("num_kv_blocks") == 14:
        assert llm.stats.preemptions > 0
    if options.get("compact_rows"):
        assert llm.core.scheduler.compactor.moves > 0


def test_the_compiled_decode_keeps_the_ops_opaque(reference_tokens):
    llm, got = tokens(kernels=True, attention="cpu", compile="aot_eager")
    assert got == reference_tokens and llm.engine.compiled.compiles >= 1


@pytest.mark.parametrize("name", ["gqa", "tied", "llama3_rope", "head_dim", "bias"])
def test_every_test_checkpoint_decodes_the_same_tokens(hf_checkpoint, name):
    path = hf_checkpoint(name)
    want = tokens(path, **REFERENCE)[1]
    assert tokens(path, kernels=True, attention="cpu")[1] == want


def test_bf16_runs_on_the_ops_and_mostly_agrees():
    """bf16 rounds where the reference rounds, but sums in another order: a greedy tie can
    flip, so this asks for agreement on most tokens, not all."""
    ref = tokens(dtype="bfloat16", **REFERENCE)[1]
    got = tokens(dtype="bfloat16", kernels=True, attention="cpu")[1]
    same = sum(a == b for r, g in zip(ref, got, strict=True) for a, b in zip(r, g, strict=True))
    assert same >= 0.8 * sum(map(len, ref))


def test_kernels_true_refuses_what_the_ops_cannot_run():
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        csrc.resolve(True, torch.device("cpu"), torch.float16)
    on, why = csrc.resolve("auto", torch.device("meta"), torch.float32)
    assert on is False and "CPU path" in why
    assert csrc.resolve(False, torch.device("cpu"), torch.float32) == (False, "kernels=False")


def test_without_the_ops_the_engine_warns_once_and_runs_the_pytorch_path():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from nanoserve import LLM, SamplingParams\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    llm = LLM(dtype='float32', skip_tokenizer_init=True)\n"
            "    LLM(dtype='float32', skip_tokenizer_init=True)\n"
            "print(llm.kernels, llm.attention, '|', llm.kernels_reason, '|',\n"
            "      sum('C++ CPU ops are unavailable' in str(x.message) for x in w))\n"
            "try:\n"
            "    LLM(dtype='float32', skip_tokenizer_init=True, kernels=True)\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n")
    env = {**os.environ, "NANOSERVE_NO_KERNELS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0] == "False gathered | NANOSERVE_NO_KERNELS is set | 1"
    assert out[1] == "refused: kernels=True: NANOSERVE_NO_KERNELS is set"
