"""The rejection sampler (``spec_decode/rejection.py``) against its definition.

Greedy: keep proposals while each is the argmax of the target's *processed* logits at its
position, then add the target's own argmax. Sampled: whatever the proposer's distribution q,
every emitted token is distributed as the target's p (Leviathan et al., Chen et al.), which the
chi-square tests check on synthetic logits over a small vocabulary, with a deliberately wrong
residual (p instead of max(0, p - q)) as the case the same test must catch. Every sampling
field reaches each position's p as it would a plain step's; a grammar ends the accepted run
where it refuses a proposal and is left as it was found; logprobs come one per emitted token.
"""

from __future__ import annotations

import pytest
import torch

from nanoserve.engine.request import Request, RequestState
from nanoserve.sampling.params import SamplingParams
from nanoserve.sampling.sampler import apply_penalties, filtered_probs, sample_requests
from nanoserve.spec_decode import rejection
from nanoserve.spec_decode.rejection import verify

V = 8
EOS = 0
CHI2_ALPHA = 1e-3  # a correct sampler's p-value stays above this (fixed seeds: deterministic)


def _request(drafts, sp=None, output=(), prompt=(1, 2, 3), q=None, **kw) -> Request:
    sp = sp or SamplingParams(temperature=0)
    r = Request(0, list(prompt), max_tokens=kw.pop("max_tokens", 100),
                eos_token_ids=kw.pop("eos", frozenset({EOS})),
                generator=kw.pop("generator", None) or sp.make_generator(), params=sp, **kw)
    r.output_token_ids = list(output)
    r.spec_token_ids, r.spec_draft_probs = list(drafts), q
    return r


def _peaked(best: list[int], vocab: int = V, seed: int = 0) -> torch.Tensor:
    """(len(best), vocab) logits whose row j has its maximum at best[j]."""
    x = torch.rand(len(best), vocab, generator=torch.Generator().manual_seed(seed))
    x[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return x


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic of observed ``counts`` (V,) against probabilities ``p`` (V,), and its
    p-value (the chi-square survival function, ``gammaincc(dof / 2, stat / 2)``). Tokens with
    p = 0 must never be observed; they are left out of the degrees of freedom."""
    counts, p = counts.double(), p.double()
    support = p > 0
    assert counts[~support].sum() == 0, f"drew impossible tokens: {counts.tolist()}"
    expected = p[support] / p[support].sum() * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(int(support.sum()) - 1), dtype=torch.float64)
    return float(stat), float(torch.special.gammaincc(dof / 2, stat / 2))


# ------------------------------------------------------------------- greedy

@pytest.mark.parametrize("drafts,target,want,accepted", [
    ([2, 5, 1], [2, 5, 1, 7], [2, 5, 1, 7], 3),  # all kept, then the bonus token
    ([3, 5, 1], [2, 5, 1, 7], [2], 0),  # the first refused: the target's own token
    ([2, 4, 1], [2, 5, 1, 7], [2, 5], 1),  # refused in the middle
    ([6], [6, 3], [6, 3], 1),
])
@pytest.mark.parametrize("draft_probs", [False, True])
def test_greedy_keeps_the_prefix_matching_the_argmax(drafts, target, want, accepted,
                                                     draft_probs):
    q = torch.full((len(drafts), V), 1 / V) if draft_probs else None  # greedy never reads it
    state = torch.get_rng_state()
    [v] = verify(_peaked(target), [_request(drafts, q=q)])
    assert (v.tokens, v.num_accepted, v.logprobs) == (want, accepted, None)
    assert torch.equal(torch.get_rng_state(), state)  # no randomness consumed


def test_a_batch_gives_each_request_what_it_gets_alone():
    """Plain greedy (the fast path) beside requests that need the general one, in any order."""
    greedy = dict(temperature=0)
    cases = [([2, 5, 1], [2, 5, 1, 7], greedy), ([3], [4, 1], greedy),
             ([1, 1], [1, 2, 6], dict(greedy, logprobs=1)),
             ([2, 6, 6], [2, 6, 5, 3], dict(greedy, repetition_penalty=1.1)),
             ([4, 4], [4, 1, 2], dict(temperature=1.0, seed=3))]
    alone = []
    for n, (d, t, kw) in enumerate(cases):
        alone.append(verify(_peaked(t, seed=n), [_request(d, SamplingParams(**kw))])[0])
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1], [1, 0], [2, 3]):
        logits = torch.cat([_peaked(cases[i][1], seed=i) for i in order])
        reqs = [_request(cases[i][0], SamplingParams(**cases[i][2])) for i in order]
        got = verify(logits, reqs)
        assert [(v.tokens, v.num_accepted) for v in got] == \
               [(alone[i].tokens, alone[i].num_accepted) for i in order]


def test_rows_must_match_the_proposals():
    with pytest.raises(ValueError, match="rows of logits"):
        verify(torch.zeros(3, V), [_request([1, 2, 3])])


# ------------------------------------------------------------------- each position's p

def test_penalties_see_the_proposals_before_each_position():
    """Row 1 prefers 2 over 3 by a hair; proposal 0 is 2, so a repetition penalty turns row 1
    to 3, exactly what a plain step sees with the output extended by the proposal."""
    logits = torch.zeros(3, V)
    logits[0, 2] = 5.0
    logits[1, 2], logits[1, 3] = 4.0, 3.9
    logits[2, 4] = 5.0
    sp = SamplingParams(temperature=0, repetition_penalty=1.5)
    [v] = verify(logits, [_request([2, 2], sp, prompt=(5,))])
    plain = sample_requests(logits[1:2], [_request([], sp, prompt=(5,), output=[2])])
    assert plain == [3]
    assert (v.tokens, v.num_accepted) == ([2, 3], 1)
    [v] = verify(logits, [_request([2, 2], SamplingParams(temperature=0), prompt=(5,))])
    assert (v.tokens, v.num_accepted) == ([2, 2, 4], 2)  # no penalty: all kept


def test_min_tokens_masks_stop_ids_while_output_and_proposals_are_short():
    """Output of 1, min_tokens 3: positions 0 and 1 (output lengths 1, 2) may not draw EOS,
    position 2 (length 3) may."""
    sp = SamplingParams(temperature=0, min_tokens=3)
    logits = _peaked([4, EOS, EOS, 6])
    logits[1, 6] = 4.0  # row 1's best once EOS is masked
    [v] = verify(logits, [_request([4, EOS, 5], sp, output=[7])])
    assert (v.tokens, v.num_accepted) == ([4, 6], 1)
    [v] = verify(logits, [_request([4, 6, EOS], sp, output=[7])])
    assert (v.tokens, v.num_accepted) == ([4, 6, EOS, 6], 3)
    stop = frozenset({5})  # stop_token_ids wait for min_tokens too
    [v] = verify(_peaked([5, 6, 5, 1]), [_request([5, 6, 5], sp, output=[7], stop_token_ids=stop)])
    assert v.num_accepted == 0 and v.tokens[0] != 5
    [v] = verify(_peaked([4, 6, 5, 1]), [_request([4, 6, 5], sp, output=[7], stop_token_ids=stop)])
    assert v.tokens == [4, 6, 5, 1]  # output length 3 at position 2: allowed


def test_each_position_draws_from_filtered_probs_of_the_extended_request(monkeypatch):
    """verify's p_j is what a plain step draws from after output + drafts[:j]."""
    seen = []
    real = rejection._draw_sampled

    def spy(r, p, T):
        seen.append(p.clone())
        return real(r, p, T)

    monkeypatch.setattr(rejection, "_draw_sampled", spy)
    sp = SamplingParams(temperature=0.7, top_k=6, top_p=0.9, min_p=0.02, min_tokens=4,
                        repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2)
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(5)) * 2
    logits[:, EOS] = 6.0  # EOS survives top-k and top-p wherever min_tokens lets it
    drafts, output, prompt = [3, 3, EOS], [1, 3], [2, 5]
    verify(logits, [_request(drafts, sp, output=output, prompt=prompt)])
    [p] = seen
    for j in range(4):
        hist = output + drafts[:j]
        x = apply_penalties(logits[j:j + 1], [prompt], [hist], [sp])
        if len(hist) < sp.min_tokens:
            x[0, EOS] = float("-inf")
        want = filtered_probs(x, [sp])[0]
        assert torch.allclose(p[j], want / want.sum(), atol=1e-6)  # the distribution it means
    assert p[0, EOS] == 0 and p[1, EOS] == 0 and p[2, EOS] > 0  # lengths 2, 3, then 4


# ------------------------------------------------------------------- logprobs

def test_logprobs_one_per_emitted_token_from_the_raw_logits():
    sp = SamplingParams(temperature=0, logprobs=2, repetition_penalty=1.3)
    logits = _peaked([2, 5, 1, 7])
    for drafts in ([2, 5, 1], [2, 4, 1], [6, 5, 1]):
        r = _request(drafts, sp)
        [v] = verify(logits, [r])
        assert len(v.logprobs) == len(v.tokens)
        for j, (t, e) in enumerate(zip(v.tokens, v.logprobs, strict=True)):
            plain = _request([], sp, output=drafts[:j])
            assert sample_requests(logits[j:j + 1], [plain]) == [t]
            [want] = plain.logprobs
            assert (e.token_id, e.rank, [t for t, _ in e.top]) == \
                   (want.token_id, want.rank, [t for t, _ in want.top])
            assert e.logprob == pytest.approx(want.logprob, abs=1e-6)
        assert r.logprobs == []  # the engine appends them, as it appends the tokens


# ------------------------------------------------------------------- distributions

def _draws(p_logits, drafts_or_q, n, seed_base, sp=None):
    """n requests over the same target rows; with a q (k, V) each request's proposals are drawn
    from it (as a draft model would draw them), else ``drafts_or_q`` is the fixed n-gram
    proposal. Returns the verdicts."""
    sp = sp or SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(seed_base)
    reqs = []
    for i in range(n):
        if isinstance(drafts_or_q, torch.Tensor):
            q = drafts_or_q
            drafts = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
        else:
            q, drafts = None, drafts_or_q
        gen = torch.Generator().manual_seed(seed_base + i)
        reqs.append(_request(drafts, sp, q=q, generator=gen))
    return verify(p_logits.repeat(n, 1), reqs)


def _first_two(verdicts):
    first = torch.bincount(torch.tensor([v.tokens[0] for v in verdicts]), minlength=V)
    second = torch.bincount(torch.tensor([v.tokens[1] for v in verdicts if len(v.tokens) > 1]),
                            minlength=V)
    return first, second


TARGET = torch.tensor([[1.0, 0.2, 2.0, -1.0, 0.5, 1.5, -0.5, 0.0],
                       [0.0, 1.2, -0.3, 2.2, 0.1, -1.0, 0.8, 1.0],
                       [0.3, 0.3, 0.3, 0.3, 2.0, 0.0, -2.0, 1.0]])  # (k + 1 = 3, V)
DRAFT = torch.tensor([[0.02, 0.02, 0.05, 0.6, 0.05, 0.2, 0.03, 0.03],  # far from p_0
                      [0.3, 0.02, 0.02, 0.1, 0.3, 0.2, 0.03, 0.03]])  # (k, V)
NGRAM = [5, 3]  # p_0(5) and p_1(3) are large: proposals kept often, refused often too


FILTERED = SamplingParams(temperature=0.9, top_k=6, top_p=0.7)  # top-p drops ~30% of the mass


def _target(sp: SamplingParams) -> torch.Tensor:
    """(k + 1, V): the distributions a plain step draws from at each position, normalised."""
    p = filtered_probs(TARGET, [sp] * TARGET.shape[0])
    return p / p.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), FILTERED],
                         ids=["plain", "filtered"])
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_emitted_tokens_follow_the_target_distribution(proposer, sp):
    verdicts = _draws(TARGET, DRAFT if proposer == "draft" else NGRAM, 3000, 1000, sp)
    first, second = _first_two(verdicts)
    p = _target(sp)
    if sp.top_p == 1:  # the definition itself, not the sampler's filtering
        assert torch.allclose(p, TARGET.softmax(dim=-1), atol=1e-6)
    stat0, pv0 = chi_square(first, p[0])
    stat1, pv1 = chi_square(second, p[1])  # given the first was a kept proposal
    print(f"{proposer}, top_p={sp.top_p}: first chi2={stat0:.2f} p={pv0:.3g}; "
          f"second chi2={stat1:.2f} p={pv1:.3g} (n={int(second.sum())})")
    assert pv0 > CHI2_ALPHA and pv1 > CHI2_ALPHA
    accepted = sum(v.num_accepted for v in verdicts)
    assert 0 < accepted < 2 * len(verdicts)  # both branches taken, many times


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_a_wrong_residual_is_caught(proposer, monkeypatch):
    """Drawing the token after a rejection from p instead of max(0, p - q) over-weights what
    the proposer favours: the same chi-square must reject it."""
    monkeypatch.setattr(rejection, "residual", lambda p, q: p.clone())
    verdicts = _draws(TARGET, DRAFT if proposer == "draft" else NGRAM, 4000, 1000)
    first, _ = _first_two(verdicts)
    stat, pv = chi_square(first, TARGET.softmax(dim=-1)[0])
    print(f"wrong residual, {proposer}: chi2={stat:.1f} p={pv:.3g}")
    assert pv < 1e-6


def test_a_seeded_request_repeats_itself_given_the_same_proposals():
    def run(seed):
        sp = SamplingParams(temperature=1.0, seed=seed)
        reqs = [_request([3, 4], sp, q=DRAFT), _request(NGRAM, sp)]
        return [(v.tokens, v.num_accepted) for v in verify(TARGET.repeat(2, 1), reqs)]

    runs = {seed: run(seed) for seed in range(12)}
    assert all(run(seed) == got for seed, got in runs.items())
    assert len({str(v) for v in runs.values()}) > 1  # and the seed matters


@pytest.mark.slow
def test_emitted_tokens_follow_the_filtered_target_with_every_field_on():
    """Four proposals, temperature, top-k, top-p and penalties: the first token against p_0,
    the token at position j (1, 2) given the kept proposals before it against p_j of the
    output extended by them."""
    k, n = 4, 40_000
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(k + 1, V, generator=gen) * 1.5
    noise = torch.rand(k, V, generator=gen) ** 3
    q = 0.6 * (logits[:k] / 0.8).softmax(-1) + 0.4 * noise / noise.sum(-1, keepdim=True)  # != p
    sp = SamplingParams(temperature=0.8, top_k=6, top_p=0.95, repetition_penalty=1.3,
                        presence_penalty=0.4, frequency_penalty=0.2)
    prompt, output = [1, 2], [4]
    g = torch.Generator().manual_seed(2024)
    reqs = [_request(torch.multinomial(q, 1, generator=g)[:, 0].tolist(), sp, q=q,
                     prompt=prompt, output=output,
                     generator=torch.Generator().manual_seed(50_000 + i)) for i in range(n)]
    verdicts = verify(logits.repeat(n, 1), reqs)

    def p_at(j, hist):
        x = apply_penalties(logits[j:j + 1], [prompt], [hist], [sp])
        return filtered_probs(x, [sp])[0]

    first = torch.bincount(torch.tensor([v.tokens[0] for v in verdicts]), minlength=V)
    stat, pv = chi_square(first, p_at(0, output))
    print(f"slow: first chi2={stat:.2f} p={pv:.3g}")
    assert pv > CHI2_ALPHA
    for j in (1, 2):  # position j given the kept proposals before it, the commonest prefixes
        after: dict[tuple, list[int]] = {}
        for v in verdicts:
            if len(v.tokens) > j:
                after.setdefault(tuple(v.tokens[:j]), []).append(v.tokens[j])
        common = sorted(after, key=lambda pre: -len(after[pre]))[:2]
        assert len(after[common[-1]]) >= 500
        for pre in common:
            counts = torch.bincount(torch.tensor(after[pre]), minlength=V)
            stat, pv = chi_square(counts, p_at(j, output + list(pre)))
            print(f"slow: position {j} after {list(pre)}: chi2={stat:.2f} p={pv:.3g} "
                  f"(n={len(after[pre])})")
            assert pv > CHI2_ALPHA


# ------------------------------------------------------------------- grammars

@pytest.fixture(scope="module")
def grammar():
    from nanoserve.config import DEFAULT_MODEL
    from nanoserve.structured.backend import GrammarBackend
    from nanoserve.structured.params import StructuredOutputsParams
    from nanoserve.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    width = tok.tok.get_vocab_size()
    backend = GrammarBackend.for_tokenizer(tok, width, [EOS])

    def make(regex):
        return backend.matcher(StructuredOutputsParams(regex=regex))

    def ids(text):
        return tok.tok.encode(text, add_special_tokens=False).ids

    return make, ids, width


def _append(r: Request, tokens: list[int]) -> int:
    """Append as the engine does, until the request finishes; how many were taken."""
    r.state = RequestState.RUNNING
    for n, t in enumerate(tokens, 1):
        if r.append_token(t):
            return n
    return len(tokens)


def _mask(matcher, width):
    from nanoserve.structured.mask import allowed, fill

    return allowed(fill([matcher], width), width)[0]


def test_a_proposal_the_grammar_refuses_ends_the_run(grammar):
    make, ids, width = grammar
    good, bad = ids("abcdab"), ids("q")
    drafts = good[:2] + bad + good[2:]
    for sp in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1)):
        r = _request(drafts, sp, max_tokens=50)
        r.matcher = make("(ab|cd)+x")
        before = _mask(r.matcher, width)
        # without the grammar every proposal is the target's favourite
        [v] = verify(_peaked(drafts + [ids("x")[0]], width), [r])
        assert v.num_accepted <= 2 and v.tokens[:v.num_accepted] == drafts[:v.num_accepted]
        assert torch.equal(_mask(r.matcher, width), before)  # left as it was found
        assert r.matcher.validate_tokens(v.tokens) == len(v.tokens)
        if sp.greedy:
            assert v.num_accepted == 2 and v.tokens[2] != bad[0]
        _append(r, v.tokens)  # what the engine does next: the matcher takes every one


def test_a_grammar_that_stops_inside_the_proposals_is_rolled_back(grammar):
    make, ids, width = grammar
    drafts = ids("ab") + [EOS] + ids("cd")
    r = _request(drafts, max_tokens=50)
    r.matcher = make("ab")
    before = _mask(r.matcher, width)
    [v] = verify(_peaked(drafts + [3], width), [r])
    assert v.tokens[:len(ids("ab"))] == ids("ab")
    assert not r.matcher.is_stopped() and torch.equal(_mask(r.matcher, width), before)
    assert _append(r, v.tokens) == len(ids("ab"))  # the grammar completes, and the request ends


# ------------------------------------------------------------------- end to end

def test_ngram_speculation_changes_no_greedy_token_with_every_field_on():
    from nanoserve.llm import LLM
    from nanoserve.model.text_loss import corpus
    from nanoserve.structured.params import StructuredOutputsParams

    _, val = corpus()
    prompts = [d[:120] + "\n" + d[:120] for d in val[:6]]  # repeats: n-gram lookup finds them
    sps = [SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.3, logprobs=2),
           SamplingParams(temperature=0, max_tokens=40, min_tokens=30, logprobs=0),
           SamplingParams(temperature=0, max_tokens=40, frequency_penalty=0.5,
                          presence_penalty=0.3),
           SamplingParams(temperature=0, max_tokens=40, logprobs=3),
           *[SamplingParams(temperature=0, max_tokens=40,  # proposals kept; most refused
                            structured_outputs=StructuredOutputsParams(regex=regex))
             for regex in (r"[^#@]*", r"[a-z ]+(\n[a-z ]+)*")]]
    base = LLM(dtype="float32").generate(prompts, sps)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4}
    llm = LLM(dtype="float32", speculative_config=spec)
    got = llm.generate(prompts, sps)
    for a, b in zip(base, got, strict=True):
        assert b.token_ids == a.token_ids
        if a.logprobs is not None:
            assert [e.token_id for e in b.logprobs] == [e.token_id for e in a.logprobs]
            assert [[t for t, _ in e.top] for e in b.logprobs] == \
                   [[t for t, _ in e.top] for e in a.logprobs]
    stats = llm.core.snapshot().spec_decode
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=40)
    once = [o.token_ids for o in llm.generate(prompts[:2], seeded)]
    assert [o.token_ids for o in llm.generate(prompts[:2], seeded)] == once  # same proposals
