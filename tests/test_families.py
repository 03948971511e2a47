"""Qwen2 and Qwen3 against transformers' own classes on checkpoints transformers wrote.

Each case is a small random checkpoint (hidden 64, 2 layers, vocab 256): Qwen2 with its q/k/v
biases (GQA, tied), Qwen3 with per-head q/k norms and a head_dim of 32 where hidden / heads is
16 (tied and untied, and with attention_bias). Prefill and decode logits through the engine and
greedy tokens are held against transformers on the default engine, the plain ``reference``
attention and chunked prefill on a budget of 8 tokens.
"""

from __future__ import annotations

import json

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.model.registry import model_class
from nanoserve.testing import greedy_logits, load_hf_model

CASES = {  # id -> (family, testing.CONFIGS name, overrides)
    "qwen2-gqa": ("qwen2", "gqa", {}),
    "qwen2-tied": ("qwen2", "tied", {}),
    "qwen3-head_dim": ("qwen3", "head_dim", {}),
    "qwen3-head_dim-tied": ("qwen3", "head_dim", {"tie_word_embeddings": True}),
    "qwen3-bias": ("qwen3", "bias", {"head_dim": 32}),
}
PATHS = {"default": {}, "reference": {"attention": "reference"},
         "chunked": {"max_num_batched_tokens": 8, "max_num_seqs": 4}}
KW = dict(dtype="float32", skip_tokenizer_init=True)
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]
STEPS = 12


@pytest.fixture(scope="module")
def case(hf_checkpoint):
    def make(cid):
        family, name, kw = CASES[cid]
        return hf_checkpoint(name, family=family, **kw)
    return make


@pytest.fixture(scope="module")
def expected(case):
    """cid -> transformers' greedy tokens and the logits that chose them, per prompt."""
    cache = {}

    def get(cid):
        if cid not in cache:
            ref, out = load_hf_model(case(cid)), []
            ref.generation_config.eos_token_id = None
            for p in PROMPTS:
                with torch.no_grad():
                    g = ref.generate(torch.tensor([p]), max_new_tokens=STEPS, do_sample=False,
                                     pad_token_id=0, output_logits=True,
                                     return_dict_in_generate=True)
                out.append((g.sequences[0, len(p):].tolist(),
                            [lg[0].float() for lg in g.logits]))
            cache[cid] = out
        return cache[cid]
    return get


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("cid", sorted(CASES))
def test_tokens_and_logits_match_transformers(case, expected, cid, path):
    llm = LLM(str(case(cid)), **KW, **PATHS[path])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS,
                                                ignore_eos=True))
    for p, out, (tokens, logits) in zip(PROMPTS, outs, expected(cid), strict=True):
        assert out.token_ids == tokens
        ours = greedy_logits(llm, p, STEPS)  # the engine's prefill, then its decodes
        diff = max((a - b).abs().max().item() for a, b in zip(ours, logits, strict=True))
        assert diff <= 1e-5, f"{cid} {path}: max |logit difference| {diff:.2e}"


@pytest.mark.parametrize("cid", ["qwen2-gqa", "qwen3-head_dim"])
def test_default_engine_equals_the_plain_path(case, cid):
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    default = LLM(str(case(cid)), **KW)
    plain = LLM(str(case(cid)), **KW, kernels=False, attention="reference")
    assert [o.token_ids for o in default.generate(PROMPTS, params)] == \
        [o.token_ids for o in plain.generate(PROMPTS, params)]


def test_qwen3_keeps_its_layers_off_the_cpp_forward(case):
    llm = LLM(str(case("qwen3-head_dim")), **KW)
    assert llm.model.fused_forward is None
    if llm.kernels:
        assert "per-head q/k RMSNorm" in llm.kernels_reason
    qwen2 = LLM(str(case("qwen2-gqa")), **KW)
    assert (qwen2.model.fused_forward is not None) == qwen2.kernels


def _config(path, **changes):
    """The checkpoint's config with ``changes``; without the layer_types transformers wrote
    (which win over max_window_layers, as they do in transformers) unless they are changed."""
    d = json.loads((path / "config.json").read_text())
    d.pop("layer_types", None)
    return ModelConfig.from_dict({**d, **changes})


@pytest.mark.parametrize("cid", ["qwen2-gqa", "qwen3-head_dim"])
def test_sliding_windows_are_refused_by_key(case, cid):
    path = case(cid)
    with pytest.raises(ValueError, match=r"use_sliding_window=True .*\(max_window_layers=1\)"):
        model_class(_config(path, use_sliding_window=True, sliding_window=16,
                            max_window_layers=1))
    with pytest.raises(ValueError, match=r"layer_types=\['sliding_attention'"):
        model_class(_config(path, use_sliding_window=True, sliding_window=16,
                            layer_types=["sliding_attention", "full_attention"]))
    # as published: a window size, switched off; or on, but no layer windowed
    for changes in ({"use_sliding_window": False, "sliding_window": 32768},
                    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}):
        cfg = _config(path, **changes)
        model_class(cfg)
        assert changes["use_sliding_window"] or cfg.sliding_window is None


def test_a_windowed_checkpoint_is_refused_at_load(case, tmp_path):
    src = case("qwen2-gqa")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    d = json.loads((src / "config.json").read_text())
    d.update(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    d.pop("layer_types", None)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        LLM(str(tmp_path), **KW)


def test_other_architectures_are_refused_with_the_list(case):
    with pytest.raises(ValueError, match=r"Qwen2 \(Qwen2ForCausalLM\), Qwen3 \(Qwen3ForCausalLM"):
        model_class(_config(case("qwen2-gqa"), architectures=["GemmaForCausalLM"],
                            model_type="gemma"))
