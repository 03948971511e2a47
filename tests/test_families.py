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

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.model.registry import model_class
from nanoserve.testing import greedy_logits, hf_greedy

CASES = {  # id -> (family, testing.CONFIGS name, overrides)
    "qwen2-gqa": ("qwen2", "gqa", {}),
    "qwen2-tied": ("qwen2", "tied", {}),
    "qwen3-head_dim": ("qwen3", "head_dim", {}),
    "qwen3-head_dim-tied": ("qwen3", "head_dim", {"tie_word_embeddings": True}),
    "qwen3-bias": ("qwen3", "bias", {"head_dim": 32}),
    # windows on the layers transformers windows: from max_window_layers on, or by layer_types
    "qwen2-window": ("qwen2", "gqa", {"use_sliding_window": True, "sliding_window": 4,
                                      "max_window_layers": 1}),
    "qwen3-window-types": ("qwen3", "head_dim", {
        "use_sliding_window": True, "sliding_window": 3,
        "layer_types": ["sliding_attention", "full_attention"]}),
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
            cache[cid] = hf_greedy(case(cid), PROMPTS, STEPS)
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


def test_windows_follow_the_keys_transformers_reads(case):
    """max_window_layers windows the layers from it on; layer_types, where written, wins; a
    window no layer uses (or switched off) is full attention; an entry this engine does not
    know, or a list of the wrong length, is refused by key."""
    path = case("qwen2-gqa")
    assert model_class(cfg := _config(path, use_sliding_window=True, sliding_window=16,
                                      max_window_layers=1)).layer_windows(cfg) == (None, 16)
    types = ["sliding_attention", "full_attention"]
    assert model_class(cfg := _config(path, use_sliding_window=True, sliding_window=16,
                                      max_window_layers=2, layer_types=types)
                       ).layer_windows(cfg) == (16, None)
    for changes in ({"use_sliding_window": False, "sliding_window": 32768},
                    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}):
        cfg = _config(path, **changes)
        assert model_class(cfg).layer_windows(cfg) == (None, None)
    with pytest.raises(ValueError, match=r"layer_types=.*names \['chunked_attention'\]"):
        model_class(_config(path, use_sliding_window=True, sliding_window=16,
                            layer_types=["chunked_attention", "full_attention"]))
    with pytest.raises(ValueError, match="layer_types has 1 entries"):
        model_class(_config(path, use_sliding_window=True, sliding_window=16,
                            layer_types=["full_attention"]))


def test_a_window_changes_the_logits(case, tmp_path):
    """The windowed checkpoint read with its window switched off gives other logits for a
    prompt longer than the window: the parity above would fail if a path ignored it."""
    src = case("qwen2-window")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    d = json.loads((src / "config.json").read_text())
    assert d["layer_types"] == ["full_attention", "sliding_attention"]
    d.update(use_sliding_window=False)
    (tmp_path / "config.json").write_text(json.dumps(d))
    windowed = greedy_logits(LLM(str(src), **KW, attention="reference"), PROMPTS[1], 1)[0]
    full = greedy_logits(LLM(str(tmp_path), **KW, attention="reference"), PROMPTS[1], 1)[0]
    assert (windowed - full).abs().max() > 1e-3


def test_other_architectures_are_refused_with_the_list(case):
    with pytest.raises(ValueError, match=r"Qwen2 \(Qwen2ForCausalLM\), Qwen3 \(Qwen3ForCausalLM"):
        model_class(_config(case("qwen2-gqa"), architectures=["GemmaForCausalLM"],
                            model_type="gemma"))


def test_a_window_no_shorter_than_the_context_is_full_attention(case):
    """Phi-3.5-mini and Phi-4-mini write a window longer than their context: nothing is
    hidden, so no backend is asked to serve a window (the C++ kernel then takes them)."""
    cfg = _config(case("qwen2-gqa"), architectures=["MistralForCausalLM"], model_type="mistral",
                  sliding_window=64, use_sliding_window=True)
    family = model_class(cfg)
    assert family.served_windows(cfg, 64) == (None, None)
    assert family.served_windows(cfg, 65) == (64, 64)
