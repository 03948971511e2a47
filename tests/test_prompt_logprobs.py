"""``prompt_logprobs`` (vLLM's extension, issue 42): every prompt token's logprob, rank and top k.

The reference is one plain forward of the shipped model over the whole prompt, without a cache
(``model(ids, positions)``, then the LM head at every position), in float32: each entry's
logprob within 1e-4 of ``log_softmax`` there, its rank counted the same way, its top k the
reference's. Held through every path a prompt's logits can take: one packed prefill, a chunked
prefill cut into several chunks, prefix caching warmed by the same prompt first (the request
must read nothing from the cache), a preemption in the middle (the resumed prefill scores
nothing twice), the mixed verify step of speculative decoding (chunks beside decodes with
proposals), and the uncached engine (Day 4). The output's shape is vLLM's: None first, one
entry per further prompt token; ``-1`` (the whole vocabulary) is refused, as vLLM refuses it
over its default cap of 20.
"""
from __future__ import annotations

import pytest
import torch

import nanoserve.engine.verify as verify_module
from nanoserve import LLM, SamplingParams
from nanoserve.engine import prompt_logprobs as prompt_logprobs_module
from nanoserve.validation import InvalidRequest

TEXT = ("Once upon a time there was a little girl who lived in a village near the forest. "
        "Whenever she went out, the little girl wore a red riding cloak.")


def reference(llm, ids: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward over ``ids``: (len(ids), V), row p predicts p + 1."""
    with torch.inference_mode():
        h = llm.model(torch.tensor([ids]), torch.arange(len(ids))[None])  # (1, T, E)
        return torch.log_softmax(llm.model.compute_logits(h[0]).float(), dim=-1)


def check(llm, ids: list[int], entries: list, k: int) -> None:
    assert entries[0] is None and len(entries) == len(ids)
    ref = reference(llm, ids)
    for p, e in enumerate(entries[1:]):
        row, t = ref[p], ids[p + 1]
        assert e.token_id == t
        assert abs(e.logprob - row[t].item()) < 1e-4, (p, e.logprob, row[t].item())
        assert e.rank == int((row >= row[t]).sum()) or abs(
            row[t].item() - row.sort(descending=True).values[e.rank - 1].item()) < 1e-4
        assert len(e.top) == k
        top_lp, top_ids = row.topk(k)
        for (tid, lp), want_lp in zip(e.top, top_lp.tolist(), strict=True):
            assert abs(lp - want_lp) < 1e-4 and abs(row[tid].item() - lp) < 1e-4


@pytest.fixture(scope="module")
def ids() -> list[int]:
    with LLM(dtype="float32") as llm:
        return llm.tokenizer.encode(TEXT)


@pytest.mark.parametrize("options", [
    {},
    {"enable_chunked_prefill": True, "max_num_batched_tokens": 8},
    {"enable_prefix_caching": True, "block_size": 4},
    {"enable_prefix_caching": True, "block_size": 4, "enable_chunked_prefill": True,
     "max_num_batched_tokens": 12},
    {"enable_kv_cache": False},
    {"prefill": "padded"},
], ids=["packed", "chunked", "prefix-cached", "both", "uncached", "padded"])
def test_prompt_logprobs_are_the_plain_forward(ids, options):
    with LLM(dtype="float32", **options) as llm:
        sp = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3)
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=3))  # warms a cache
        hits = llm.stats.prefix_cache_hits
        out = llm.generate([ids, ids[:9]], sp)
        assert llm.stats.prefix_cache_hits == hits  # it read nothing from the cache
        check(llm, ids, out[0].prompt_logprobs, 3)
        check(llm, ids[:9], out[1].prompt_logprobs, 3)
        plain = llm.generate([ids], SamplingParams(temperature=0, max_tokens=3))[0]
        assert plain.prompt_logprobs is None and plain.token_ids == out[0].token_ids
        if options.get("enable_prefix_caching"):  # others still hit what it computed
            assert llm.stats.prefix_cache_hits > hits


def test_zero_top_and_a_one_token_prompt(ids):
    with LLM(dtype="float32") as llm:
        a, b = llm.generate([ids, ids[:1]], SamplingParams(max_tokens=2, prompt_logprobs=0))
        check(llm, ids, a.prompt_logprobs, 0)
        assert b.prompt_logprobs == [None]


def test_minus_one_is_refused_over_the_cap():
    with LLM(dtype="float32") as llm:
        with pytest.raises(InvalidRequest) as e:
            llm.generate(["hello"], SamplingParams(prompt_logprobs=-1))
        assert e.value.param == "prompt_logprobs"
    for bad in (21, -2, 1.5):
        with pytest.raises(InvalidRequest):
            SamplingParams(prompt_logprobs=bad)


def test_a_preempted_prompt_is_scored_once(ids):
    """A pool too small for three long requests: the youngest is preempted and re-prefilled;
    its prompt logprobs are still one per prompt token, each right."""
    with LLM(dtype="float32", block_size=4, num_kv_blocks=40, max_num_seqs=3,
             enable_chunked_prefill=True, max_num_batched_tokens=16) as llm:
        sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, prompt_logprobs=2)
        out = llm.generate([ids, ids[3:], ids[6:]], sp)
        assert llm.stats.preemptions > 0, "nobody was preempted: the test would prove nothing"
        for o in out:
            check(llm, o.prompt_token_ids, o.prompt_logprobs, 2)


def test_speculative_decoding_mixed_steps(ids, monkeypatch):
    """Chunks beside decodes that carry proposals run in one verify forward (verify.py): a
    prompt's logprobs scored there are the plain forward's too."""
    calls = []
    real = prompt_logprobs_module.record

    def spy(*args):
        calls.append(1)
        return real(*args)

    class Spy:  # verify.py's view of the module, with record counted
        plan = staticmethod(prompt_logprobs_module.plan)
        record = staticmethod(spy)

    monkeypatch.setattr(verify_module, "prompt_logprobs", Spy)
    repeat = ids[:5] * 3  # the first request repeats itself: n-gram lookup proposes
    with LLM(dtype="float32", max_num_seqs=2, enable_chunked_prefill=True,
             max_num_batched_tokens=20,
             speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                 "prompt_lookup_min": 1, "prompt_lookup_max": 3}) as llm:
        first = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
        second = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=4)
        out = llm.generate([repeat, ids], [first, second])
        assert calls, "no verify step scored a prompt: the test would prove nothing"
        check(llm, ids, out[1].prompt_logprobs, 4)
