"""vLLM's extra sampling fields: each penalty, min-p, min_tokens and logprobs against a plain
Python reference written here, plus validation and sameness with ``sample`` when they are off."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.engine.request import Request, RequestState
from nanoserve.sampling.params import SamplingParams
from nanoserve.sampling.sampler import (
    TokenLogprob,
    apply_penalties,
    filtered_probs,
    min_p_mask,
    sample,
    sample_requests,
)

V = 40
EOS = 3


def _logits(seed: int, rows: int = 1, vocab: int = V) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _request(prompt, output=(), sp=None, eos=frozenset({EOS}), stop_ids=frozenset(), **kw):
    sp = sp or SamplingParams(temperature=0)
    r = Request(0, list(prompt), max_tokens=kw.pop("max_tokens", 100), eos_token_ids=eos,
                stop_token_ids=stop_ids, generator=sp.make_generator(), params=sp, **kw)
    r.output_token_ids = list(output)
    return r


# ------------------------------------------------------------------- plain references

def ref_penalties(row: list[float], prompt: list[int], output: list[int],
                  sp: SamplingParams) -> list[float]:
    """vLLM's rules, one token at a time."""
    counts = Counter(output)
    seen = set(prompt) | set(output)
    out = []
    for t, x in enumerate(row):
        if t in seen:
            x = x / sp.repetition_penalty if x > 0 else x * sp.repetition_penalty
        x -= sp.frequency_penalty * counts[t]
        if counts[t]:
            x -= sp.presence_penalty
        out.append(x)
    return out


def ref_min_p_keep(row: list[float], temperature: float, min_p: float) -> list[bool | None]:
    """True/False per token; None where float32 rounding could decide either way."""
    m = max(row)
    weights = [math.exp((x - m) / temperature) for x in row]  # prob / max prob
    return [None if abs(w - min_p) < 1e-4 else w >= min_p for w in weights]


def ref_log_softmax(row: list[float]) -> list[float]:
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


histories = st.lists(st.integers(0, V - 1), max_size=12)
penalty = st.floats(-2, 2, allow_nan=False)
rep_penalty = st.floats(0.05, 5, allow_nan=False)


# ------------------------------------------------------------------- penalties

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.lists(
    st.tuples(st.lists(st.integers(0, V - 1), min_size=1, max_size=12), histories,
              rep_penalty, penalty, penalty), min_size=1, max_size=4))
def test_penalties_match_the_reference(seed, batch):
    logits = _logits(seed, len(batch))
    sps = [SamplingParams(repetition_penalty=rp, frequency_penalty=fp, presence_penalty=pp)
           for _, _, rp, fp, pp in batch]
    got = apply_penalties(logits, [b[0] for b in batch], [b[1] for b in batch], sps)
    want = [ref_penalties(logits[i].tolist(), p, o, sp)
            for i, ((p, o, *_), sp) in enumerate(zip(batch, sps, strict=True))]
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field,value", [("repetition_penalty", 1.7),
                                         ("frequency_penalty", 0.9),
                                         ("presence_penalty", -1.3)])
def test_each_penalty_alone(field, value):
    logits = _logits(1)
    prompt, output = [0, 1, 2, 1], [5, 5, 6, 0]
    sp = SamplingParams(**{field: value})
    got = apply_penalties(logits, [prompt], [output], [sp])[0]
    torch.testing.assert_close(got, torch.tensor(ref_penalties(logits[0].tolist(), prompt,
                                                               output, sp)))
    untouched = [t for t in range(V) if t not in {0, 1, 2, 5, 6}]
    assert torch.equal(got[untouched], logits[0, untouched])
    if field != "repetition_penalty":  # the prompt does not count for these two
        assert torch.equal(got[[1, 2]], logits[0, [1, 2]])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), prompt=st.lists(st.integers(0, V - 1), min_size=1,
                                                    max_size=10),
       output=histories, rp=rep_penalty, fp=penalty, pp=penalty)
def test_greedy_rows_take_the_argmax_of_the_penalised_logits(seed, prompt, output, rp, fp, pp):
    """In a mixed batch: penalised greedy, plain greedy, penalised sampled with top_k=1."""
    logits = _logits(seed, 3)
    before = logits.clone()
    pen = dict(repetition_penalty=rp, frequency_penalty=fp, presence_penalty=pp)
    reqs = [_request(prompt, output, SamplingParams(temperature=0, **pen)),
            _request(prompt, output, SamplingParams(temperature=0)),
            _request(prompt, output, SamplingParams(temperature=0.7, top_k=1, seed=0, **pen))]
    got = sample_requests(logits, reqs)
    ref = ref_penalties(logits[0].tolist(), prompt, output, reqs[0].params)
    ref2 = ref_penalties(logits[2].tolist(), prompt, output, reqs[2].params)
    assert got[0] == max(range(V), key=ref.__getitem__)
    assert got[1] == int(logits[1].argmax())
    assert got[2] == max(range(V), key=ref2.__getitem__)
    assert torch.equal(logits, before)  # the caller's logits are not edited in place


def test_repetition_penalty_pushes_seen_tokens_down_on_both_signs():
    logits = torch.tensor([[2.0, -2.0, 0.0, 1.0]])
    got = apply_penalties(logits, [[0, 1, 2]], [[]], [SamplingParams(repetition_penalty=2.0)])
    assert got.tolist() == [[1.0, -4.0, 0.0, 1.0]]


# ------------------------------------------------------------------- min_p

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), min_p=st.floats(0, 1, allow_nan=False),
       temperature=st.floats(0.1, 3, allow_nan=False))
def test_min_p_matches_the_reference(seed, min_p, temperature):
    logits = _logits(seed)
    probs = filtered_probs(logits, [SamplingParams(temperature=temperature, min_p=min_p)])
    ref = ref_min_p_keep(logits[0].tolist(), temperature, min_p)
    got = (probs[0] > 0).tolist()
    assert all(w is None or w == g for w, g in zip(ref, got, strict=True))
    assert got[int(logits.argmax())]  # the most likely token always survives


def test_min_p_mask_on_a_hand_made_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    keep = min_p_mask(probs, torch.tensor([0.4, 0.0]))  # threshold 0.2 (kept: >=) and off
    assert keep.tolist() == [[True, True, True], [True, True, True]]
    keep = min_p_mask(probs, torch.tensor([0.41, 1.0]))
    assert keep.tolist() == [[True, True, False], [True, False, False]]


def test_min_p_composes_with_top_k_and_top_p_and_draws_only_survivors():
    logits = _logits(7) / 3  # flat enough that each filter has something to cut
    sp = SamplingParams(temperature=0.9, top_k=10, top_p=0.95, min_p=0.2, seed=3)
    probs = filtered_probs(logits, [sp])[0]
    top10 = set(logits[0].topk(10).indices.tolist())
    ref = ref_min_p_keep(logits[0].tolist(), 0.9, 0.2)
    support = {t for t in range(V) if probs[t] > 0}
    no_min_p = filtered_probs(logits, [SamplingParams(temperature=0.9, top_k=10, top_p=0.95)])
    assert support <= top10 and len(support) > 1
    assert support == {t for t in range(V) if no_min_p[0, t] > 0 and ref[t]}  # an intersection
    r = _request([1], sp=sp)
    draws = {sample_requests(logits, [r])[0] for _ in range(200)}
    assert draws <= support and len(draws) > 1


# ------------------------------------------------------------------- min_tokens

def test_min_tokens_masks_eos_and_stop_ids_in_the_sampler():
    logits = torch.zeros(3, V)
    logits[:, EOS] = 50.0  # EOS is overwhelmingly likely
    logits[:, 7] = 40.0  # a stop_token_id, next
    logits[:, 9] = 30.0
    sp_greedy = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[7])
    sp_sampled = SamplingParams(temperature=1.0, min_tokens=2, stop_token_ids=[7], seed=0)
    short = _request([1], [5], sp_greedy, stop_ids=frozenset({7}))  # 1 < 2: masked
    done = _request([1], [5, 5], sp_greedy, stop_ids=frozenset({7}))  # 2 >= 2: free
    sampled = _request([1], [], sp_sampled, stop_ids=frozenset({7}))
    assert short.min_tokens == 2  # taken from the params by default
    assert sample_requests(logits, [short, done, sampled]) == [9, EOS, 9]
    assert logits[0, EOS] == 50.0  # the mask is on a copy


def test_ignore_eos_style_request_masks_only_what_it_stops_on():
    logits = torch.zeros(1, V)
    logits[0, EOS] = 50.0
    r = _request([1], [], SamplingParams(temperature=0, min_tokens=3), eos=frozenset())
    assert sample_requests(logits, [r]) == [EOS]  # no EOS ids on the request: nothing to mask


def _running(**kw) -> Request:
    r = _request([1, 2], **kw)
    r.transition(RequestState.RUNNING)
    return r


def test_append_token_stop_rules_wait_for_min_tokens():
    r = _running(min_tokens=3, stop_ids=frozenset({7}))
    assert [r.append_token(t) for t in (EOS, 7)] == [False, False]
    assert r.append_token(EOS) and (r.finish_reason, r.stop_reason) == ("stop", EOS)
    assert len(r.output_token_ids) == 3


def test_min_tokens_never_outlasts_the_budget():
    r = _running(min_tokens=5, max_tokens=2)
    assert [r.append_token(t) for t in (EOS, EOS)] == [False, True]
    assert r.finish_reason == "length"


def test_min_tokens_holds_back_stop_strings():
    class Detok:  # one character per token: token t is chr(ord('a') + t)
        def __init__(self):
            self.text = ""

        def push(self, token: int) -> str:
            self.text += chr(ord("a") + token)
            return chr(ord("a") + token)

    r = _running(min_tokens=3, stop=("b",), detokenizer=Detok())
    assert r.append_token(1) is False  # "b" before min_tokens: ignored
    assert r.append_token(0) is False
    assert r.append_token(1) is True and (r.stop_reason, r.text) == ("b", "ba")


def test_request_min_tokens_default_override_and_validation():
    sp = SamplingParams(min_tokens=4)
    assert _request([1], sp=sp).min_tokens == 4
    assert _request([1], sp=sp, min_tokens=1).min_tokens == 1
    assert Request(0, [1], max_tokens=3).min_tokens == 0
    with pytest.raises(ValueError, match="min_tokens must be >= 0"):
        Request(0, [1], max_tokens=3, min_tokens=-1)


# ------------------------------------------------------------------- logprobs

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), ks=st.lists(st.sampled_from([None, 0, 1, 5, 20]),
                                                min_size=1, max_size=4))
def test_logprobs_come_from_the_raw_logits(seed, ks):
    """Penalties and temperature change the draw, never the reported logprobs."""
    logits = _logits(seed, len(ks))
    reqs = [_request([1, 2], [2], SamplingParams(temperature=0.6, seed=i, logprobs=k,
                                                 repetition_penalty=1.4, min_p=0.05))
            for i, k in enumerate(ks)]
    tokens = sample_requests(logits, reqs)
    ref = torch.log_softmax(logits, dim=-1)
    for i, (r, k, t) in enumerate(zip(reqs, ks, tokens, strict=True)):
        if k is None:
            assert r.logprobs == []
            continue
        (e,) = r.logprobs
        assert isinstance(e, TokenLogprob) and e.token_id == t
        assert e.logprob == pytest.approx(float(ref[i, t]), abs=1e-5)
        row = ref_log_softmax(logits[i].tolist())
        assert e.logprob == pytest.approx(row[t], abs=1e-4)
        assert e.rank == 1 + sum(x > row[t] for x in row)
        want_ids = sorted(range(V), key=lambda j: -row[j])[:k]
        assert [tid for tid, _ in e.top] == want_ids
        assert [lp for _, lp in e.top] == pytest.approx([row[j] for j in want_ids], abs=1e-4)
        assert all(isinstance(tid, int) for tid, _ in e.top)


def test_logprobs_accumulate_one_per_step_and_greedy_has_rank_one():
    r = _request([1], sp=SamplingParams(temperature=0, logprobs=2))
    for step in range(3):
        t = sample_requests(_logits(step), [r])[0]
        r.output_token_ids.append(t)
    assert [e.rank for e in r.logprobs] == [1, 1, 1]
    assert [e.token_id for e in r.logprobs] == r.output_token_ids
    assert all(e.top[0] == (e.token_id, e.logprob) and len(e.top) == 2 for e in r.logprobs)


def test_logprobs_larger_than_the_vocabulary_are_capped():
    r = _request([1], sp=SamplingParams(temperature=0, logprobs=20))
    sample_requests(_logits(0, vocab=5), [r])
    assert len(r.logprobs[0].top) == 5


# ------------------------------------------------------------------- validation

BAD = [
    ("min_p", -0.1, r"min_p must be in \[0, 1\]"), ("min_p", 1.01, r"min_p must be in"),
    ("min_p", math.nan, "min_p"), ("min_p", math.inf, "min_p"), ("min_p", "0.1", "min_p"),
    ("presence_penalty", -2.01, r"presence_penalty must be in \[-2, 2\]"),
    ("presence_penalty", 2.5, "presence_penalty"), ("presence_penalty", math.nan,
                                                    "presence_penalty"),
    ("presence_penalty", -math.inf, "presence_penalty"),
    ("frequency_penalty", 2.01, r"frequency_penalty must be in \[-2, 2\]"),
    ("frequency_penalty", -3, "frequency_penalty"), ("frequency_penalty", math.nan,
                                                     "frequency_penalty"),
    ("frequency_penalty", math.inf, "frequency_penalty"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
    ("repetition_penalty", -1.0, "repetition_penalty"),
    ("repetition_penalty", math.nan, "repetition_penalty"),
    ("repetition_penalty", math.inf, "repetition_penalty"),
    ("min_tokens", -1, "min_tokens must be >= 0"), ("min_tokens", 1.5, "min_tokens must be an int"),
    ("min_tokens", True, "min_tokens"), ("min_tokens", 17, "min_tokens must be <= max_tokens=16"),
    ("logprobs", -1, r"logprobs must be None or in \[0, 20\]"), ("logprobs", 21, "logprobs"),
    ("logprobs", 2.0, "logprobs must be an int"), ("logprobs", math.nan, "logprobs"),
]


@pytest.mark.parametrize("field,value,pattern", BAD)
def test_bad_values_are_refused_naming_the_field(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kwargs", [
    dict(min_p=0.0), dict(min_p=1.0), dict(presence_penalty=-2.0), dict(presence_penalty=2),
    dict(frequency_penalty=-2), dict(frequency_penalty=2.0), dict(repetition_penalty=1e-3),
    dict(repetition_penalty=100.0), dict(min_tokens=16), dict(min_tokens=500, max_tokens=None),
    dict(logprobs=0), dict(logprobs=20),
])
def test_edge_values_are_accepted(kwargs):
    SamplingParams(**kwargs)


def test_new_defaults_are_vllms():
    sp = SamplingParams()
    assert (sp.min_p, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty,
            sp.min_tokens, sp.logprobs) == (0.0, 0.0, 0.0, 1.0, 0, None)
    assert not sp.penalised


# ------------------------------------------------------------------- sameness with sample()

OLD_STYLE = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=5, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.9, seed=4, stop_token_ids=[EOS]),
]


@pytest.mark.parametrize("logprobs", [None, 3])
def test_sample_requests_draws_what_sample_draws(logprobs):
    """Seeded, over several steps: same tokens, same RNG consumption. Logprobs change neither."""
    reqs = [_request([1, 2, 3], sp=SamplingParams(**{**{f: getattr(sp, f) for f in (
        "temperature", "top_k", "top_p", "seed", "stop_token_ids")}, "logprobs": logprobs}))
            for sp in OLD_STYLE]
    gens = [sp.make_generator() for sp in OLD_STYLE]
    for step in range(6):
        logits = _logits(100 + step, len(OLD_STYLE), vocab=1000)
        want = sample(logits, OLD_STYLE, gens).tolist()
        assert sample_requests(logits, reqs) == want
        for r, t in zip(reqs, want, strict=True):
            r.output_token_ids.append(t)
    assert all(len(r.logprobs) == (0 if logprobs is None else 6) for r in reqs)


# ------------------------------------------------------------------- through the engine

@pytest.fixture(scope="module")
def llm(hf_checkpoint):
    from nanoserve import LLM

    return LLM(hf_checkpoint("gqa"), dtype="float32", skip_tokenizer_init=True)


def test_min_tokens_through_the_engine(llm):
    """The engine's sampler masks the stop id for the first min_tokens tokens."""
    free = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=12,
                                                    ignore_eos=True))[0].token_ids
    stop = [free[0]]
    early = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=12,
                                                     ignore_eos=True, stop_token_ids=stop))[0]
    assert early.token_ids == stop and early.finish_reason == "stop"
    held = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=12, min_tokens=3,
                                                    ignore_eos=True, stop_token_ids=stop))[0]
    assert len(held.token_ids) >= 3 and stop[0] not in held.token_ids[:3]
