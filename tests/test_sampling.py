"""SamplingParams validation and the sampler's filters, pinned on hand-made distributions."""

from __future__ import annotations

import pytest
import torch

from nanoserve.sampling.params import SamplingParams
from nanoserve.sampling.sampler import filtered_probs, sample, top_k_mask, top_p_mask


def test_vllm_defaults():
    sp = SamplingParams()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.seed) == (1.0, 1.0, 0, 16, None)
    assert (sp.stop, sp.stop_token_ids, sp.ignore_eos) == ([], [], False)
    assert SamplingParams(stop="END").stop == ["END"]


@pytest.mark.parametrize("kwargs,pattern", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -2}, "top_k"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"stop": [""]}, "non-empty"),
])
def test_out_of_range_is_refused(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**kwargs)


def test_stop_token_ids_checked_against_vocab():
    with pytest.raises(ValueError, match="token id 300 is outside the vocabulary"):
        SamplingParams(stop_token_ids=[300]).check_vocab(256)


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3], [0.2, 0.5, 0.3]])
    keep = top_p_mask(probs, torch.tensor([0.6, 0.5, 0.81]))
    # 0.6: 0.5 alone is short of it, 0.3 crosses it and is kept; 0.2 is not needed.
    assert keep[0].tolist() == [False, True, True]
    # 0.5: the top token alone reaches it.
    assert keep[1].tolist() == [False, True, False]
    # 0.81: 0.5 + 0.3 = 0.8 is short, so the 0.2 that crosses is kept too.
    assert keep[2].tolist() == [True, True, True]


def test_top_k():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert top_k_mask(logits, torch.tensor([2])).tolist() == [[False, True, True, False]]
    assert top_k_mask(logits, torch.tensor([0])).all()


def test_greedy_is_argmax_and_consumes_no_randomness():
    """Greedy rows take the argmax and draw nothing: neither their own generators nor the
    global one advance, and a sampled row beside them draws what it draws alone."""
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 0.0]])
    greedy = SamplingParams(temperature=0, seed=5)
    gens = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    states = [g.get_state() for g in gens]
    global_state = torch.random.get_rng_state()
    out = sample(logits, [greedy] * 2, gens)
    assert out.tolist() == [1, 0]
    assert all(torch.equal(g.get_state(), s) for g, s in zip(gens, states, strict=True))
    assert torch.equal(torch.random.get_rng_state(), global_state)

    sampled = SamplingParams(temperature=1.0, seed=11)
    wide = torch.zeros(1, 50)
    g = sampled.make_generator()
    alone = [int(sample(wide, [sampled], [g])[0]) for _ in range(20)]
    g = sampled.make_generator()
    greedy_gen = torch.Generator().manual_seed(5)
    before = greedy_gen.get_state()
    mixed = [int(sample(torch.cat([wide, wide]), [greedy, sampled], [greedy_gen, g])[1])
             for _ in range(20)]
    assert mixed == alone
    assert torch.equal(greedy_gen.get_state(), before)
    assert torch.equal(torch.random.get_rng_state(), global_state)


def test_seeded_sampling_is_reproducible_and_respects_filters():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    sp = SamplingParams(temperature=0.8, top_k=5, seed=42)
    draws = [int(sample(logits, [sp], [sp.make_generator()])[0]) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same token
    top5 = set(logits[0].topk(5).indices.tolist())
    g = SamplingParams(temperature=1.0, top_k=5, seed=1).make_generator()
    many = {int(sample(logits, [SamplingParams(top_k=5)], [g])[0]) for _ in range(200)}
    assert many <= top5 and len(many) > 1


def test_mixed_batch_greedy_and_sampled_rows():
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0]])
    sp = SamplingParams(temperature=1.0, top_k=1, seed=0)
    out = sample(logits, [SamplingParams(temperature=0), sp], [None, sp.make_generator()])
    assert out.tolist() == [1, 2]


def test_top_p_one_keeps_the_whole_vocabulary():
    """float32 cumsum over a large vocabulary reaches 1.0 early; top_p=1 must still be off."""
    logits = torch.randn(2, 128_256, generator=torch.Generator().manual_seed(0)) * 3
    probs = logits.softmax(-1)
    assert top_p_mask(probs, torch.tensor([1.0, 1.0])).sum() < 2 * 128_256  # the trap
    kept = filtered_probs(logits, [SamplingParams(top_p=1.0), SamplingParams(top_p=1.0)])
    assert bool((kept > 0).all())
    mixed = filtered_probs(logits, [SamplingParams(top_p=1.0), SamplingParams(top_p=0.5)])
    assert bool((mixed[0] > 0).all()) and int((mixed[1] > 0).sum()) < 128_256


def test_tiny_temperature_is_greedy_and_no_global_rng_side_effect():
    logits = torch.tensor([[0.0, 1.0, 0.5]])
    sp = SamplingParams(temperature=1e-40)
    assert sp.greedy and sample(logits, [sp], [sp.make_generator()]).tolist() == [1]
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    SamplingParams(temperature=1.0).make_generator()
    assert torch.equal(torch.rand(1), a)


def test_top_k_keeps_exactly_k_under_ties():
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert int(top_k_mask(logits, torch.tensor([2])).sum()) == 2
