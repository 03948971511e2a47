"""Prompt lookup (``spec_decode/ngram.py``): vLLM's proposals, by three routes that must agree.

- ``kmp_like_vllm`` below restates vLLM v1's algorithm (KMP over the reversed tokens, the prefix
  table capped at ``prompt_lookup_max``, the position moved on ``>=``); hypothesis checks the
  plain reference ``propose_ngram`` against it on small-alphabet sequences, where matches,
  overlaps and ties are common;
- ``NgramIndex``, what the proposer runs, fed a request's tokens a few at a time, equals the
  reference after every step;
- worked examples, the ``max_model_len`` cap, the proposer's bookkeeping, the back-off rule, and
  the engine: float32 greedy tokens are the same with prompt lookup on and off, and ``llm.stats``
  counts the drafts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.config.speculative import SpeculativeConfig
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams
from nanoserve.spec_decode import ngram
from nanoserve.spec_decode.backoff import AcceptanceBackoff, BackoffPolicy
from nanoserve.spec_decode.ngram import NgramIndex, NgramProposer, propose_ngram
from nanoserve.spec_decode.proposer import proposer_class


def kmp_like_vllm(tokens, min_n, max_n, k, max_model_len):
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens``, restated: reversed, the
    suffix is a prefix; the longest prefix (up to max_n) seen ending at each later position,
    the last such position kept on ties, which is the earliest in the original order."""
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest = position = matched = 0
    i = 1
    while i < total:
        if rev[matched] == rev[i]:
            matched += 1
            if matched >= longest:
                longest, position = matched, i
            if i < max_n:
                lps[i] = matched
            if matched == max_n:
                matched = lps[max_n - 1]
            i += 1
        elif matched:
            matched = lps[matched - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)]


lookups = st.tuples(st.integers(1, 4), st.integers(0, 3)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=40), lookups, st.integers(1, 6),
       st.integers(0, 10))
def test_the_reference_is_vllms_rule(tokens, bounds, k, room):
    lo, hi = bounds
    mml = len(tokens) + room - 2  # a little short of, at, or past the context's end
    assert propose_ngram(tokens, lo, hi, k, mml) == kmp_like_vllm(tokens, lo, hi, k, mml)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=80), st.lists(st.integers(1, 12),
       min_size=1, max_size=30), lookups, st.integers(1, 5))
def test_the_index_equals_the_reference_after_every_step(tokens, chunks, bounds, k):
    lo, hi = bounds
    cut, at = [], 0
    for c in chunks:  # the prompt, then the tokens each step adds
        at = min(len(tokens), at + c)
        cut.append(at)
    index = NgramIndex(lo, hi, tokens[:cut[0]])
    for a, b in zip(cut, cut[1:] + [cut[-1]], strict=True):
        assert index.propose(k, 10**6) == propose_ngram(tokens[:a], lo, hi, k, 10**6)
        index.extend(tokens[a:b])


@pytest.mark.parametrize("tokens, lo, hi, k, mml, want", [
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, 100, [4, 2, 3]),  # vLLM's docstring: 3 tokens follow
    ([1, 2, 9, 8, 1, 2, 7, 1, 2], 2, 2, 2, 100, [9, 8]),  # the earliest occurrence
    ([2, 3, 8, 1, 2, 3, 5, 1, 2, 3], 2, 3, 4, 100, [5, 1, 2, 3]),  # the longest n first
    ([5, 5, 5, 5], 2, 3, 4, 100, [5]),  # overlapping the suffix counts
    ([1, 2, 3], 4, 5, 4, 100, []),  # shorter than prompt_lookup_min
    ([1, 2, 3, 1, 2, 3], 4, 5, 4, 100, []),  # no n >= min matches (3 does)
    ([1, 2, 3, 1, 2, 3], 3, 3, 4, 100, [1, 2, 3]),
    ([1, 2, 3, 1, 2, 3], 3, 3, 4, 8, [1, 2]),  # max_model_len - 6 = 2
    ([1, 2, 3, 1, 2, 3], 3, 3, 4, 6, []),  # at max_model_len: vLLM skips the request
])
def test_worked_examples(tokens, lo, hi, k, mml, want):
    assert propose_ngram(tokens, lo, hi, k, mml) == want
    assert NgramIndex(lo, hi, tokens).propose(k, mml) == want


# ------------------------------------------------------------------------------ the proposer


def request(rid, prompt, output=()):
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(prompt),
                           output_token_ids=list(output), spec_token_ids=[],
                           spec_draft_probs="stale")


def proposer(k=4, lo=2, hi=3, max_model_len=100, backoff=None):
    config = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": k,
                                      "prompt_lookup_min": lo, "prompt_lookup_max": hi})
    if backoff is None:
        return proposer_class("ngram").create(config, SimpleNamespace(max_model_len=max_model_len))
    return NgramProposer(config, max_model_len, backoff=backoff)


def test_the_proposer_sets_proposals_caps_them_and_forgets_the_gone():
    p = proposer(max_model_len=12)
    assert p.backoff is None and ngram.NGRAM_BACKOFF is None  # vLLM's behaviour by default
    a = request("a", [1, 2, 3, 4, 1, 2], [3])  # 7 tokens: 5 positions left
    b = request("b", [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3])  # 11 tokens: 1 left
    p.propose([a, b])
    assert a.spec_token_ids == [4, 1, 2, 3] and b.spec_token_ids == [4]
    assert a.spec_draft_probs is None and b.spec_draft_probs is None
    b.output_token_ids.append(4)  # 12 tokens: at max_model_len
    p.propose([a, b])
    assert b.spec_token_ids == []
    p.propose([a])
    assert set(p.indexes) == {"a"}
    fresh = request("a", [7, 8, 9, 7, 8])  # a reused id is a new request: its own tokens
    p.propose([fresh])
    assert fresh.spec_token_ids == [9, 7, 8]
    p.release(fresh)
    assert p.indexes == {}
    assert "ngram (prompt lookup, n in [2, 3]), 4 tokens a step" == p.describe()


def run(p, r, target, steps):
    """``steps`` engine steps: propose, then verify against ``target(r)`` (the token the target
    writes after ``r``'s tokens); returns whether each step had proposals."""
    had = []
    for _ in range(steps):
        p.propose([r])
        had.append(bool(r.spec_token_ids))
        for t in r.spec_token_ids:  # accepted while the target agrees
            if target(r) != t:
                break
            r.output_token_ids.append(t)
        r.output_token_ids.append(target(r))  # then a token of the target's own
    return had


def test_backoff_pauses_a_request_whose_proposals_all_miss_and_doubles_the_pause():
    p = proposer(lo=1, hi=1, backoff=BackoffPolicy(after=2, pause=3, max_pause=8))
    r = request("a", [0, 1, 2, 0, 1, 2])

    def contrary(r):  # never what was proposed
        return (r.spec_token_ids[0] + 1) % 3 if r.spec_token_ids else 0

    had = run(p, r, contrary, 22)
    on = [i + 1 for i, h in enumerate(had) if h]
    # misses at 1, 2: pause 3 (3-5); probe 6 misses: pause 6 (7-12); probe 13: pause 8 (cap)
    assert on == [1, 2, 6, 13, 22]
    assert "backing off after 2 missed steps" in p.describe()


def test_backoff_leaves_an_accepting_request_alone_and_one_hit_resets_it():
    policy = BackoffPolicy(after=2, pause=3, max_pause=8)
    p = proposer(lo=1, hi=1, backoff=policy)
    r = request("a", [0, 1, 2, 0, 1, 2])

    def agreeing(r):  # the pattern goes on: 0 1 2 0 1 2 ...
        return (r.prompt_token_ids + r.output_token_ids)[-3]

    assert all(run(p, r, agreeing, 10))
    b = AcceptanceBackoff(policy)
    q = request("b", [], [5])
    flags = []
    for accept in (False,) * 5 + (True,) + (False,) * 6:
        go = b.gate(q)
        flags.append(go)
        if go:
            b.record(q, [9, 9])
            q.output_token_ids += [9, 9, 5] if accept else [5]
        else:
            q.output_token_ids.append(5)
    # miss, miss, pause 3, a probe that hits; two misses more: a pause of 3 again, not 6
    assert flags == [True, True, False, False, False, True, True, True, False, False, False,
                     True]


@pytest.mark.parametrize("bad, name", [({"after": 0}, "after"), ({"pause": 0}, "pause"),
                                       ({"pause": 4, "max_pause": 2}, "max_pause"),
                                       ({"after": True}, "after")])
def test_a_bad_backoff_policy_is_refused_by_name(bad, name):
    with pytest.raises(ValueError, match=f"BackoffPolicy: {name}"):
        BackoffPolicy(**bad)


# ------------------------------------------------------------------------------ the engine

PROMPT = ('Class definitions\n*****************\n\nA class definition is an executable statement.'
          '  The inheritance list\nusually gives a list of base classes.\n\n   class Foo:\n'
          '       pass\n\nis equivalent to\n\n   class Foo(object):\n       pass\n\n')
PROMPTS = [PROMPT, "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef",
           "+-----------+-----------+\n| Operator  | Meaning   |\n+-----------+-----------+\n"
           "| \"<\"       | less      |\n+-----------+-----------+\n"]


def test_prompt_lookup_changes_no_token_and_stats_count_its_drafts():
    greedy = SamplingParams(temperature=0, max_tokens=32)
    with LLM(dtype="float32") as plain:
        want = [o.token_ids for o in plain.generate(PROMPTS, greedy)]
        assert plain.stats.spec_decode_num_drafts == 0
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4}
    with LLM(dtype="float32", speculative_config=spec) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == want
        s = llm.stats
        assert 0 < s.spec_decode_num_accepted_tokens <= s.spec_decode_num_draft_tokens
        assert s.spec_decode_num_draft_tokens <= 4 * s.spec_decode_num_drafts
        assert sum(s.spec_decode_num_accepted_tokens_per_pos) == s.spec_decode_num_accepted_tokens
        assert s.spec_decode_mean_acceptance_length == pytest.approx(
            1 + s.spec_decode_num_accepted_tokens / s.spec_decode_num_drafts)
        first = (s.spec_decode_num_drafts,)
        llm.core.proposer.backoff = AcceptanceBackoff(BackoffPolicy(after=1, pause=2))
        assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == want  # backing off too
        assert llm.stats.spec_decode_num_drafts > first[0]  # the stats add up per call
