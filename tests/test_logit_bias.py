"""``logit_bias`` (issue 42): OpenAI's bias per token id, added to the logits before sampling.

What is held: on the shipped model in float32, a +100 bias makes greedy (and sampled) decoding
emit that token every step, and a -100 bias keeps the greedy choice out of the text; values are
clamped to [-100, 100] and string keys read as ids, as vLLM's ``SamplingParams.from_optional``
does; an id outside the vocabulary or a key that is no id is an ``InvalidRequest`` naming
``logit_bias``; the bias is added before the penalties (vLLM's order), checked by hand on small
logits; and under speculative decoding (n-gram proposals, which know nothing of the bias) the
text is the text without speculation, with proposals accepted and the bias visibly at work.
"""
from __future__ import annotations

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.model.text_loss import corpus
from nanoserve.sampling.sampler import process_logits
from nanoserve.validation import InvalidRequest

PROMPT = "Once upon a time there was a little"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def llm():
    with LLM(dtype="float32", max_num_seqs=4, speculative_config=SPEC) as llm:
        yield llm


def _spec_off(llm, prompts, sp):
    """The same engine with its proposer taken away: speculation off."""
    proposer, llm.core.proposer = llm.core.proposer, None
    try:
        return llm.generate(prompts, sp)
    finally:
        llm.core.proposer = proposer


def _plain_ids(llm) -> list[int]:
    """Token ids that are neither EOS nor special: candidates to force."""
    V = llm.config.vocab_size
    return [t for t in (17, V // 3, V // 2, V - 7) if t not in llm.eos_token_ids]


def test_a_large_bias_forces_the_token(llm):
    for t in _plain_ids(llm):
        for temperature in (0, 1.0):
            sp = SamplingParams(temperature=temperature, seed=3, max_tokens=6,
                                logit_bias={t: 100})
            out = _spec_off(llm, [PROMPT], sp)[0]
            assert out.token_ids == [t] * 6, (t, temperature, out.token_ids)


def test_a_negative_bias_bans_the_greedy_choice(llm):
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = _spec_off(llm, [PROMPT], sp)[0].token_ids
    banned = plain[0]
    out = _spec_off(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                  logit_bias={banned: -100}))[0].token_ids
    assert out[0] != banned and banned not in out


def test_values_clamp_and_string_keys_read_as_ids(llm):
    t = _plain_ids(llm)[0]
    sp = SamplingParams(temperature=0, max_tokens=4, logit_bias={str(t): 1e9})
    assert sp.logit_bias == {t: 100.0}
    assert SamplingParams(logit_bias={"3": -1e9}).logit_bias == {3: -100.0}
    assert _spec_off(llm, [PROMPT], sp)[0].token_ids == [t] * 4


@pytest.mark.parametrize("bias", [{"five": 1.0}, {"1.5": 1.0}, {1.5: 1.0}, {"3": "x"},
                                  {"3": float("nan")}])
def test_keys_and_values_that_are_not_ids_and_numbers(bias):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(logit_bias=bias)
    assert e.value.param == "logit_bias"


def test_ids_outside_the_vocabulary_are_refused(llm):
    V = llm.config.vocab_size
    for bad in (V, -1, 10**9):
        with pytest.raises(InvalidRequest) as e:
            llm.generate([PROMPT], SamplingParams(max_tokens=2, logit_bias={bad: 1.0}))
        assert e.value.param == "logit_bias"
    assert llm.core.snapshot().num_free_blocks == llm.core.snapshot().num_blocks


def test_the_bias_comes_before_the_penalties():
    """vLLM applies logit_bias (a logits processor) before the penalties: a seen token's
    biased logit is what repetition_penalty divides or multiplies."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    sp = SamplingParams(repetition_penalty=2.0, logit_bias={0: 4.0, 1: 3.0, 2: -2.0})
    x = process_logits(logits, [sp], [[0, 1, 2]], [[]], [set()])
    # (2 + 4) / 2, (-1 + 3) / 2 (now positive: divided), (0.5 - 2) * 2, 3 unseen and unbiased
    assert x.tolist() == [[3.0, 1.0, -3.0, 3.0]]
    assert logits.tolist() == [[2.0, -1.0, 0.5, 3.0]]  # the raw logits are untouched


def test_bias_under_speculative_decoding_is_the_text_without_it(llm):
    """n-gram proposals copy the prompt and ignore the bias; the target's rows carry it (the
    rejection sampler's greedy fast path is closed to a biased request), so the text is the
    one written without speculation, and proposals were still checked."""
    passages = [d for d in corpus()[0] if len(d) > 400][:3]
    prompts = [p[:200] + p[:50] for p in passages]
    plain = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    base = _spec_off(llm, prompts, plain)
    # ban each text's 13th greedy token (proposals before it, a changed text after it) and
    # favour its 6th a little
    sps = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                          logit_bias={b.token_ids[12]: -100.0, b.token_ids[5]: 2.5})
           for b in base]
    before = llm.core.snapshot().spec_decode.num_drafts
    on = llm.generate(prompts, sps)
    drafts = llm.core.snapshot().spec_decode.num_drafts - before
    off = _spec_off(llm, prompts, sps)
    assert drafts > 0, "no proposal was checked: the test would prove nothing"
    for b, x, y in zip(base, on, off, strict=True):
        assert (x.token_ids, x.text) == (y.token_ids, y.text)
        assert x.token_ids != b.token_ids and b.token_ids[12] not in x.token_ids
    sampled = [SamplingParams(temperature=0.8, seed=5, max_tokens=30, ignore_eos=True,
                              logit_bias={b.token_ids[0]: -100.0}) for b in base]
    for b, x in zip(base, llm.generate(prompts, sampled), strict=True):
        assert b.token_ids[0] not in x.token_ids  # the sampled path's rows carry it too
