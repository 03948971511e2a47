"""Gemma 3 against transformers' own classes, on checkpoints they wrote.

The checkpoint (``testing.VARIANTS["gemma3"]``): 4 layers, local (a window of 4 tokens, shorter
than two of the three prompts) and global alternating, head_dim 32 where hidden / heads is 16,
``query_pre_attn_scalar`` 8 (q's factor 2, exact), linear RoPE scaling on the global layers'
base and another base on the local ones, a final logit soft-cap, and random norm weights, so
that ``(1 + w)`` matters. Greedy tokens and every prefill and decode logit are held against
transformers on the reference and gathered backends, whole and chunked (chunks of 8 cross the
window's edge), and the uncached forward. The same weights with the published spelling of the
config (``rope_theta``, ``rope_local_base_freq``, ``rope_scaling``, ``sliding_window_pattern``)
give the same logits; with a window wider than the prompt they give other logits, so a path that
ignored the window would fail, and so would one that rotated the local layers with the global
base. A ``query_pre_attn_scalar`` that is not head_dim times a power of 4 (q's factor rounds:
see ``model/gemma3.py``) is held to the same bound on the uncached forward. A
``Gemma3ForConditionalGeneration`` checkpoint serves its language model. Keys nanoserve cannot
honour are refused by name.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.model.registry import model_class
from nanoserve.model.weights import load_model
from nanoserve.testing import greedy_logits, hf_greedy, load_hf_model

KW = dict(dtype="float32", skip_tokenizer_init=True, attention="reference", kernels=False)
PATHS = {"whole": {}, "chunked": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
         "uncached": {"enable_kv_cache": False}}
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77], [11, 22, 33]]
STEPS = 12
PUBLISHED = dict(rope_theta=100_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=2,
                 rope_scaling={"rope_type": "linear", "factor": 8.0})


@pytest.fixture(scope="module")
def gemma(hf_checkpoint):
    return hf_checkpoint("gemma3", family="gemma3")


def rewritten(src, dst, drop=(), **changes):
    """A copy of checkpoint ``src`` at ``dst`` whose config.json has ``changes``."""
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    d = json.loads((src / "config.json").read_text())
    for key in drop:
        d.pop(key, None)
    d.update(changes)
    (dst / "config.json").write_text(json.dumps(d))
    return dst


@pytest.fixture(scope="module")
def published(gemma, tmp_path_factory):
    """The same model in the published configs' spelling."""
    return rewritten(gemma, tmp_path_factory.mktemp("gemma3-published"),
                     drop=("rope_parameters", "layer_types", "_sliding_window_pattern"),
                     **PUBLISHED)


@pytest.fixture(scope="module")
def expected(gemma):
    return hf_greedy(gemma, PROMPTS, STEPS)


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def prompt_logits(model, ids):
    """The uncached forward's logits at every position of ``ids``: (T, V)."""
    with torch.no_grad():
        if hasattr(model, "compute_logits"):
            return model.compute_logits(model(torch.tensor([ids]),
                                              torch.arange(len(ids))[None]))[0]
        return model(torch.tensor([ids])).logits[0]


CASES = [("reference", p) for p in sorted(PATHS)] + [("gathered", "chunked"),
                                                     ("gathered", "whole")]


@pytest.mark.parametrize("attention,path", CASES)
def test_tokens_and_logits_match_transformers(gemma, expected, attention, path):
    llm = LLM(str(gemma), **{**KW, "attention": attention}, **PATHS[path])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS,
                                                ignore_eos=True))
    for p, out, (tokens, logits) in zip(PROMPTS, outs, expected, strict=True):
        assert out.token_ids == tokens
        if path == "uncached":
            continue  # greedy_logits reads the engine's cache
        diff = max_diff(greedy_logits(llm, p, STEPS), logits)  # measured 2.95e-06
        assert diff <= 1e-5, f"{attention} {path}: max |logit difference| {diff:.2e}"


def test_the_published_spelling_is_the_same_model(gemma, published, expected):
    ids = PROMPTS[1]
    ref = prompt_logits(load_hf_model(published), ids)  # transformers reads it the same way
    assert (ref - prompt_logits(load_hf_model(gemma), ids)).abs().max().item() == 0
    assert (prompt_logits(load_model(published, "float32"), ids) - ref).abs().max() <= 1e-5
    llm = LLM(str(published), **KW)
    assert max_diff(greedy_logits(llm, ids, STEPS), expected[1][1]) <= 1e-5


def test_the_window_and_the_local_base_are_not_ignored(gemma, expected, tmp_path):
    """A window wider than the prompt: transformers and nanoserve agree, and differ from the
    windowed model past the window; the local layers on the global base: other logits too."""
    ids = PROMPTS[1]  # 12 tokens, a window of 4
    full = rewritten(gemma, tmp_path / "full", sliding_window=64)
    ref = prompt_logits(load_hf_model(full), ids)
    assert (prompt_logits(load_model(full, "float32"), ids) - ref).abs().max() <= 1e-5
    ours = prompt_logits(load_model(gemma, "float32"), ids)
    assert (ours[:4] - ref[:4]).abs().max() <= 1e-5  # the window holds the whole prefix
    assert (ours[4:] - ref[4:]).abs().max(dim=-1).values.min() > 1e-3
    assert (ours[-1] - expected[1][1][0]).abs().max() <= 1e-5
    d = json.loads((gemma / "config.json").read_text())
    rope = {t: d["rope_parameters"]["full_attention"] for t in d["rope_parameters"]}
    one_base = load_model(rewritten(gemma, tmp_path / "base", rope_parameters=rope), "float32")
    assert (prompt_logits(one_base, ids) - ours).abs().max() > 1e-3


def test_a_scalar_that_rounds(hf_checkpoint):
    """query_pre_attn_scalar 24 with head_dim 32: q's factor sqrt(4/3) rounds, the logits move
    in their last bits (measured 1.9e-6 on logits of about 4), not bit-identical as with 8."""
    path = hf_checkpoint("gemma3", family="gemma3", query_pre_attn_scalar=24)
    ours = prompt_logits(load_model(path, "float32"), PROMPTS[1])
    diff = (ours - prompt_logits(load_hf_model(path), PROMPTS[1])).abs().max().item()
    assert diff <= 1e-5, f"max |logit difference| {diff:.2e}"


def test_the_language_model_of_a_multimodal_checkpoint(hf_checkpoint, caplog):
    path = hf_checkpoint("gemma3", family="gemma3-vision", final_logit_softcapping=None)
    with caplog.at_level(logging.INFO, logger="nanoserve"):
        ours = load_model(path, "float32")
    assert "vision tower and projector tensors not loaded" in caplog.text
    ref = load_hf_model(path)
    assert type(ref).__name__ == "Gemma3ForConditionalGeneration"
    ids = PROMPTS[1]
    assert (prompt_logits(ours, ids) - prompt_logits(ref, ids)).abs().max() <= 1e-5
    d = json.loads((path / "config.json").read_text())
    d["text_config"]["final_logit_softcapping"] = 30.0
    with pytest.raises(ValueError, match="text_config.final_logit_softcapping=30.0"):
        model_class(ModelConfig.from_dict(d))


@pytest.mark.parametrize("change,pattern", [
    ({"hidden_activation": "gelu"}, r"hidden_activation='gelu'"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention",
                      "full_attention"]}, r"layer_types=.*\['chunked_attention'\]"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types has 3 entries"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
     r"rope_parameters.sliding_attention.rope_type='yarn'"),
])
def test_what_cannot_be_honoured_is_refused_by_key(gemma, change, pattern):
    d = json.loads((gemma / "config.json").read_text())
    with pytest.raises(ValueError, match=pattern):
        model_class(ModelConfig.from_dict({**d, **change}))


def test_the_engine_refuses_what_it_cannot_serve(gemma, tmp_path):
    with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
        LLM(str(rewritten(gemma, tmp_path / "cap", attn_logit_softcapping=50.0)), **KW)
    llm = LLM(str(gemma), **{**KW, "kernels": True})  # the ops, but Gemma's layers in PyTorch
    assert llm.model.fused_forward is None
    if llm.kernels:
        assert "no Gemma layer" in llm.kernels_reason
