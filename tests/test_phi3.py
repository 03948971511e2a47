"""Phi-3 against transformers' Phi3ForCausalLM, on small checkpoints it wrote (testing.VARIANTS).

Five checkpoints (hidden 64, heads 4 over 2 KV heads, head_dim 16, fused ``qkv_proj`` and
``gate_up_proj`` as Phi-3 stores them): plain; a partial rotary of 0.75 (12 of 16 dims turned); a
sliding window of 5; ``longrope`` with seeded factors and an original length of 16 tokens (its
attention factor the default, sqrt(1 + ln 8 / ln 16)); and longrope with the partial rotary and
tied embeddings, as Phi-4-mini. Longrope is held in the two regimes where transformers' choice
(per forward, by the longest position) equals the engine's (once, by ``max_model_len``): an
engine of ``max_model_len`` 16 on sequences within 16 tokens (short factors), and an engine of
128 on prompts of 17 to 23 tokens (long factors). Each is held on the ``reference`` and
``gathered`` attention, whole and chunked (a budget of 8 tokens), for greedy tokens identical and
logits within 1e-5; the uncached forward gives the same tokens; long prompts sharing a prefix
go through the prefix cache and preemption. Tests below fail where the partial rotary, the
factors' choice or the attention factor is dropped, and the refusals name their key.
"""

from __future__ import annotations

import json

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import ModelConfig
from nanoserve.layers.rotary import rope_attention_factor
from nanoserve.model.registry import model_class
from nanoserve.testing import greedy_logits, hf_greedy, load_hf_model

KW = dict(dtype="float32", skip_tokenizer_init=True, kernels=False)
SHORT = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150], [11, 22, 33]]
LONG = [[(7 * i + 3 * n) % 250 + 1 for i in range(n)] for n in (17, 23, 20)]
CASES = {  # id -> (variant, engine's max_model_len, prompts, greedy steps)
    "plain": ("phi3", None, SHORT, 6),
    "partial": ("phi3-partial", None, SHORT, 6),
    "window": ("phi3-window", None, SHORT, 6),
    "longrope-short": ("phi3-longrope", 16, SHORT, 6),
    "longrope-long": ("phi3-longrope", None, LONG, 6),
    "longrope-partial-short": ("phi3-longrope-partial", 16, SHORT, 6),
    "longrope-partial-long": ("phi3-longrope-partial", None, LONG, 6),
}
PATHS = {"whole": {}, "chunked": {"max_num_batched_tokens": 8, "max_num_seqs": 4}}


@pytest.fixture(scope="module")
def ckpt(hf_checkpoint):
    return lambda variant: hf_checkpoint(variant, family="phi3")


@pytest.fixture(scope="module")
def expected(ckpt):
    """case -> transformers' greedy tokens and the logits that chose them, per prompt."""
    cache: dict[str, list] = {}

    def get(cid):
        if cid not in cache:
            variant, _, prompts, steps = CASES[cid]
            cache[cid] = hf_greedy(ckpt(variant), prompts, steps)
        return cache[cid]
    return get


def engine(ckpt, cid, **kw):
    variant, max_model_len, _, _ = CASES[cid]
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    return LLM(str(ckpt(variant)), **{**KW, **kw})


def max_diff(ours, theirs):
    return max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))


def check(llm, cid, expected):
    _, _, prompts, steps = CASES[cid]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=steps,
                                                ignore_eos=True))
    worst = 0.0
    for p, out, (tokens, logits) in zip(prompts, outs, expected(cid), strict=True):
        assert out.token_ids == tokens
        worst = max(worst, max_diff(greedy_logits(llm, p, steps), logits))
    return worst


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("attention", ["reference", "gathered"])
@pytest.mark.parametrize("cid", sorted(CASES))
def test_tokens_and_logits_match_transformers(ckpt, expected, cid, attention, path):
    llm = engine(ckpt, cid, attention=attention, **PATHS[path])
    diff = check(llm, cid, expected)
    assert diff <= 1e-5, f"{cid} {attention} {path}: max |logit difference| {diff:.2e}"


@pytest.mark.parametrize("cid", ["window", "longrope-partial-short", "longrope-long"])
def test_the_uncached_forward_gives_the_same_tokens(ckpt, expected, cid):
    _, _, prompts, steps = CASES[cid]
    llm = engine(ckpt, cid, attention="reference", enable_kv_cache=False)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=steps,
                                                ignore_eos=True))
    assert [o.token_ids for o in outs] == [tokens for tokens, _ in expected(cid)]


@pytest.mark.parametrize("cid", ["plain", "longrope-long", "longrope-partial-long"])
def test_the_default_engine_and_the_cpp_forward(ckpt, expected, cid):
    """The default engine (the C++ ops where they load) matches too: it reads the model's own
    cos and sin, so longrope's factors reach it; a partial rotary keeps its layers here."""
    llm = engine(ckpt, cid, kernels="auto")
    assert check(llm, cid, expected) <= 1e-5
    partial = "partial" in cid
    assert llm.model.fused_forward is None if partial else \
        (llm.model.fused_forward is not None) == llm.kernels
    if partial:
        assert "turns 12 of 16 dims" in llm.model.fused_problem


def test_longrope_under_prefix_caching_and_preemption(ckpt):
    """The static choice keeps a cached key a function of its position alone, so long prompts
    sharing a 16-token prefix, found again by the prefix cache and preempted out of a pool of 14
    blocks of 4, still give transformers' tokens; after the drain every block is free."""
    prefix = LONG[1][:16]
    prompts = [prefix + [9 + i, 40 + 3 * i, 101 + i] + [7] * i for i in range(4)]
    ref = load_hf_model(ckpt("phi3-longrope-partial"))
    ref.generation_config.eos_token_id = None
    want = []
    for p in prompts:
        with torch.no_grad():
            g = ref.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False,
                             pad_token_id=0)
        want.append(g[0, len(p):].tolist())
    llm = engine(ckpt, "longrope-partial-long", attention="reference", block_size=4,
                 num_kv_blocks=14, max_num_batched_tokens=8, enable_prefix_caching=True)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in outs] == want
    assert llm.core.scheduler.preemptions > 0 and llm.core.scheduler.prefix_cache_hits > 0
    snap = llm.core.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def test_a_dropped_partial_rotary_would_be_caught(ckpt, expected, tmp_path):
    """The same weights with the whole head turned give logits far past the bound."""
    src = ckpt("phi3-partial")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    d = json.loads((src / "config.json").read_text())
    d["rope_parameters"]["partial_rotary_factor"] = 1.0
    (tmp_path / "config.json").write_text(json.dumps(d))
    full = LLM(str(tmp_path), **KW, attention="reference")
    assert full.model.inv_freq.numel() == 8  # 16 dims turned, 8 pairs
    prompt, (_, logits) = SHORT[1], expected("partial")[1]
    assert max_diff(greedy_logits(full, prompt, 6), logits) > 1e-3


def test_longrope_factors_are_chosen_once_by_max_model_len(ckpt, expected):
    """The engine of 128 turns every key by the long factors, a short prompt's too, where
    transformers turns a short sequence by the short ones (the static rule's known difference):
    logits far apart. On the long prompts it matches (above); its short twin does not take them.
    Dropping the attention factor is caught as well."""
    long_engine = engine(ckpt, "longrope-long", attention="reference")
    assert long_engine.model.long_factors and long_engine.model.rope_scale > 1.3
    prompt, (_, short_logits) = SHORT[1], expected("longrope-short")[1]
    assert max_diff(greedy_logits(long_engine, prompt, 6), short_logits) > 1e-3
    short_engine = engine(ckpt, "longrope-short", attention="reference")
    assert not short_engine.model.long_factors
    assert max_diff(greedy_logits(short_engine, prompt, 6), short_logits) <= 1e-5
    short_engine.model.rope_scale = 1.0  # cos and sin without the attention factor
    assert max_diff(greedy_logits(short_engine, prompt, 6), short_logits) > 1e-3


def test_the_window_is_honoured(ckpt, expected):
    """The windowed checkpoint against transformers' logits of the same weights unwindowed:
    a 10-token prompt under a window of 5 gives other logits, so the parity above needs it."""
    llm = engine(ckpt, "window", attention="reference")
    assert llm.model.windows == (5, 5)
    ref = load_hf_model(ckpt("phi3-window"))
    ref.config.sliding_window = None
    with torch.no_grad():
        full = ref(torch.tensor([SHORT[1]])).logits[0, -1]
    assert (greedy_logits(llm, SHORT[1], 1)[0] - full).abs().max().item() > 1e-3


def _config(**changes):
    d = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 32, "hidden_size": 64,
         "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 64, "original_max_position_embeddings": 16,
         "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
                          "long_factor": [2.0] * 8}}
    return {**d, **changes}


@pytest.mark.parametrize("changes,match", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope_scaling.rope_type='dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r"rope_scaling.rope_type='llama3' on Phi3: it computes longrope"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 8}},
     r"rope_scaling.short_factor=\[1.0, .*8 numbers"),
    ({"original_max_position_embeddings": None},
     r"longrope' without original_max_position_embeddings"),
    ({"partial_rotary_factor": 0.1}, r"partial_rotary_factor turns 1 of head_dim=16"),
    ({"sliding_window": 0}, r"sliding_window=0"),
    ({"architectures": ["LlamaForCausalLM"]},
     r"rope_scaling.rope_type='longrope' on Llama: it computes linear, llama3"),
])
def test_refusals_name_the_key(changes, match):
    with pytest.raises(ValueError, match=match):
        model_class(ModelConfig.from_dict(_config(**changes)))


def test_the_attention_factor_is_read_or_derived():
    cfg = ModelConfig.from_dict(_config())  # 64 / 16 = 4: sqrt(1 + ln 4 / ln 16) = sqrt(1.5)
    assert rope_attention_factor(cfg) == pytest.approx(1.5 ** 0.5)
    scaling = {**_config()["rope_scaling"], "attention_factor": 1.25}
    assert rope_attention_factor(ModelConfig.from_dict(_config(rope_scaling=scaling))) == 1.25
    assert model_class(cfg).uses_long_factors(cfg, 17) and \
        not model_class(cfg).uses_long_factors(cfg, 16)
