"""nanoserve's Llama against transformers' LlamaForCausalLM on the same checkpoint folders."""

from __future__ import annotations

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.attention.kv_cache import KVCache
from nanoserve.model.weights import load_model
from nanoserve.testing import CONFIGS, load_hf_model, relative_logit_error

NAMES = sorted(CONFIGS)


def _prompts(vocab: int, n: int = 4) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, vocab - 1, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(hf_checkpoint, name):
    path = hf_checkpoint(name)
    ours, ref = load_model(path, "float32"), load_hf_model(path)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(40)[None].expand(2, 40)
    with torch.no_grad():
        a = ours.compute_logits(ours(ids, pos))
        b = ref(ids).logits
    assert relative_logit_error(a, b) < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_transformers_generate(hf_checkpoint, name):
    path = hf_checkpoint(name)
    ref = load_hf_model(path)
    ref.generation_config.eos_token_id = None  # both sides run the full 32 tokens
    llm = LLM(path, dtype="float32", skip_tokenizer_init=True)
    prompts = _prompts(256)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    for p, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            seq = ref.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False,
                               pad_token_id=0)
        expected = seq[0, len(p):].tolist()
        assert out.token_ids == expected
    assert [len(o.token_ids) for o in outs] == [32] * 4


@pytest.mark.parametrize("name", NAMES)
def test_cached_equals_uncached(hf_checkpoint, name):
    path = hf_checkpoint(name)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    cached = LLM(path, dtype="float32", skip_tokenizer_init=True)
    uncached = LLM(path, dtype="float32", skip_tokenizer_init=True, enable_kv_cache=False)
    prompts = _prompts(256)
    a = [o.token_ids for o in cached.generate(prompts, params)]
    b = [o.token_ids for o in uncached.generate(prompts, params)]
    assert a == b


def test_cache_prefill_in_pieces_equals_one_forward(hf_checkpoint):
    model = load_model(hf_checkpoint("llama3_rope"), "float32")
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(30)[None]
    with torch.no_grad():
        full = model(ids, pos)
        cache = KVCache.for_model(model, 1, 30)
        parts = []
        for a, b in ((0, 11), (11, 12), (12, 30)):
            parts.append(model(ids[:, a:b], pos[:, a:b], cache))
            cache.advance(b - a)
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_fp32(hf_checkpoint, dtype):
    path = hf_checkpoint("gqa")
    ref = load_hf_model(path)
    ours = load_model(path, dtype)
    assert ours.embed_tokens.weight.dtype == dtype
    ids = torch.arange(2, 34)[None]
    with torch.no_grad():
        err = relative_logit_error(ours.compute_logits(ours(ids, torch.arange(32)[None])),
                                   ref(ids).logits)
    assert err < 5e-2


def test_kv_cache_refuses_overflow(hf_checkpoint):
    model = load_model(hf_checkpoint("gqa"), "float32")
    cache = KVCache.for_model(model, 1, 4)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long), torch.arange(5)[None], cache)
