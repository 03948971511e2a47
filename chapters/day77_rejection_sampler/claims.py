"""Day 77's claims: the rejection sampler changes no distribution, shown by experiment on the
snapshot, and the engine's ``verify`` is held to the snapshot token for token.

Two halves:

- **The proof by experiment** (the snapshot alone, float64, one seeded generator, vectorised
  over 100,000 verify steps): a six-token vocabulary, a target ``P`` and a draft ``Q`` that
  differ, four proposals a step drawn from ``Q``. The first token each step emits is counted and
  held to ``P`` by a chi-square test; the same draws through two broken rules (after a rejection,
  draw from ``p`` or from ``q`` instead of ``max(0, p - q)``) fail it. The acceptance rate and the
  tokens per step are measured against ``sum_x min(p(x), q(x))`` and ``(1 - a^(k+1)) / (1 - a)``;
  an n-gram proposal (``q`` a point mass) is run the same way; and two-token sequences of a
  Markov chain, several verify steps each, are held to the chain's joint distribution. Every
  operation is IEEE float64 arithmetic on Mersenne Twister draws, so the statistics are the
  same on any machine with this torch.
- **The engine** (``nanoserve.spec_decode.rejection.verify``): random logits and proposals for
  200 requests a case, each with its own seeded generator. The snapshot is given the same
  uniforms (the first k draws of a generator seeded alike) and the target's own token is drawn
  with ``torch.multinomial`` from the snapshot's weights on that generator, which is how the
  engine spends its random numbers. Its ``p`` is the plain step's: the sampler's penalties with
  the proposals before a position counted as history, the ``min_tokens`` ban, then
  ``filtered_probs`` (temperature, top-k, top-p, min-p). The seed rows run the engine's
  ``verify`` and the plain ``sample_requests`` as a tiny decode loop over the Markov chain.
"""

from __future__ import annotations

import functools

import torch

from chapters.runner import bound, exact

from .snapshot import rejection as rj

P = (0.30, 0.25, 0.20, 0.12, 0.08, 0.05)  # the target's distribution
Q = (0.10, 0.30, 0.30, 0.05, 0.15, 0.10)  # the draft's
K = 4  # proposals a step
STEPS = 100_000
SEED = 77
NGRAM_TOKEN = 2  # the n-gram proposer's certain guess
REQUESTS = 200  # engine cases
F64 = torch.float64


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(P, dtype=F64), torch.tensor(Q, dtype=F64)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """counts (C,), probs (C,) -> (statistic, degrees of freedom, p-value): Pearson's test of
    the counts against the distribution; the p-value is the chi-square law's upper tail,
    ``Q(dof / 2, stat / 2)``, the regularised upper incomplete gamma function."""
    n = counts.sum().to(F64)
    live = probs > 0
    want = n * probs[live].to(F64)
    stat = ((counts[live].to(F64) - want) ** 2 / want).sum()
    dof = int(live.sum()) - 1
    return float(stat), dof, float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=F64),
                                                           stat / 2))


# ------------------------------------------------------------------------ one position

BROKEN = {"max(0, p - q)": rj.residual,
          "p": lambda p, q: p,  # a rejection redraws from the target: the kept mass counts twice
          "q": lambda p, q: q}  # ... from the draft: the target never gets its own say


def proposer_q(proposer: str) -> torch.Tensor:
    p, q = tensors()
    return rj.point_mass(torch.tensor(NGRAM_TOKEN), p.numel(), F64) if proposer == "ngram" else q


@functools.cache
def draws(proposer: str):
    """The random part of STEPS verify steps: K proposals drawn from the proposer's q, the K
    uniforms of the tests and the one of the target's draw, from one generator."""
    q = proposer_q(proposer)
    g = torch.Generator().manual_seed(SEED)
    drafts = rj.draw(q.expand(STEPS * K, q.numel()), torch.rand(STEPS * K, generator=g,
                                                                  dtype=F64))
    u = torch.rand(STEPS, K, generator=g, dtype=F64)
    return drafts.view(STEPS, K), u, torch.rand(STEPS, generator=g, dtype=F64)


@functools.cache
def steps(after_rejection: str = "max(0, p - q)", proposer: str = "draft"):
    """STEPS verify steps of K proposals, every position with the same p and q -> (tokens
    (STEPS, K + 1), accepted (STEPS,)). Every rule meets the same draws."""
    p, q = tensors()[0], proposer_q(proposer)
    V = p.numel()
    return rj.rejection_sample(p.expand(STEPS, K + 1, V), q.expand(STEPS, K, V),
                               *draws(proposer), BROKEN[after_rejection])


def first_token_test(after_rejection: str = "max(0, p - q)", proposer: str = "draft"):
    tokens, _ = steps(after_rejection, proposer)
    p, _ = tensors()
    return chi_square(torch.bincount(tokens[:, 0], minlength=p.numel()), p)


def measured_acceptance(proposer: str = "draft") -> float:
    """Proposals kept over proposals judged: a step judges its kept ones and, unless all K were
    kept, the one it rejected."""
    _, a = steps(proposer=proposer)
    judged = a + (a < K).long()
    return float(a.sum().to(F64) / judged.sum())


def exact_acceptance(proposer: str = "draft") -> float:
    p, q = tensors()
    return float(p[NGRAM_TOKEN]) if proposer == "ngram" else float(rj.acceptance_rate(p, q))


def mean_tokens() -> float:
    return float((steps()[1] + 1).to(F64).mean())


def formula_tokens() -> float:
    return rj.expected_tokens(exact_acceptance(), K)


def ngram_residual_gap() -> float:
    """The n-gram residual normalised, against p with the guess removed and renormalised."""
    p, _ = tensors()
    w = rj.residual(p, rj.point_mass(torch.tensor(NGRAM_TOKEN), p.numel(), F64))
    without = p.clone()
    without[NGRAM_TOKEN] = 0
    return float((w / w.sum() - without / without.sum()).abs().max())


# ------------------------------------------------------------------------ sequences

START, SEQ_K, SEQUENCES = 0, 3, 50_000


@functools.cache
def chains() -> tuple[torch.Tensor, torch.Tensor]:
    """Two Markov chains over the six tokens, (V, V) each: row x is the next token's law after
    x. ``P`` is the target, ``Q`` the draft; every entry at least 0.2 / 7.2 of its row."""
    g = torch.Generator().manual_seed(SEED + 1)
    P_, Q_ = (torch.rand(6, 6, generator=g, dtype=F64) + 0.2 for _ in range(2))
    return P_ / P_.sum(1, keepdim=True), Q_ / Q_.sum(1, keepdim=True)


def chain_step(last: torch.Tensor, g: torch.Generator):
    """One verify step for every sequence, its last token ``last`` (n,): the draft proposes
    SEQ_K tokens along its chain and the target's rows follow them -> (tokens, accepted)."""
    P_, Q_ = chains()
    n = last.shape[0]
    ctx = [last]
    for _ in range(SEQ_K):
        ctx.append(rj.draw(Q_[ctx[-1]], torch.rand(n, generator=g, dtype=F64)))
    ctx = torch.stack(ctx, dim=1)  # (n, SEQ_K + 1): the last token, then the proposals
    u = torch.rand(n, SEQ_K, generator=g, dtype=F64)
    v = torch.rand(n, generator=g, dtype=F64)
    return rj.rejection_sample(P_[ctx], Q_[ctx[:, :SEQ_K]], ctx[:, 1:], u, v)


@functools.cache
def sequences(n: int = SEQUENCES) -> torch.Tensor:
    """The first two tokens of n sequences from START, (n, 2): the second is the first step's
    second token when it kept a proposal, else the next step's first."""
    g = torch.Generator().manual_seed(SEED + 2)
    first, a = chain_step(torch.full((n,), START), g)
    then, _ = chain_step(first[torch.arange(n), a], g)
    return torch.stack([first[:, 0], torch.where(a >= 1, first[:, 1], then[:, 0])], dim=1)


def sequence_test() -> tuple[float, int, float]:
    P_, _ = chains()
    s = sequences()
    V = P_.shape[0]
    joint = P_[START][:, None] * P_  # (V, V): P(x0) P(x1 | x0)
    return chi_square(torch.bincount(s[:, 0] * V + s[:, 1], minlength=V * V), joint.flatten())


# ------------------------------------------------------------------------ the engine


def _request(i: int, params, output: list[int], drafts: list[int], q, eos=frozenset()):
    from nanoserve.engine.request import Request

    r = Request(i, [1, 2, 3], max_tokens=64, eos_token_ids=eos, params=params,
                generator=params.make_generator())
    r.output_token_ids = list(output)
    r.spec_token_ids, r.spec_draft_probs = list(drafts), q
    return r


def plain_p(row: torch.Tensor, r, history: list[int], banned: bool) -> torch.Tensor:
    """The distribution a plain step of ``r`` draws from after ``history`` (V,), float32: the
    penalties over prompt and history, the stop ids banned while short of min_tokens, then
    temperature, top-k, top-p and min-p, normalised."""
    from nanoserve.sampling.sampler import apply_penalties, filtered_probs

    x = row[None].clone()
    if r.params.penalised:
        x = apply_penalties(x, [r.prompt_token_ids], [history], [r.params])
    if banned:
        x[0, sorted(r.eos_token_ids)] = float("-inf")
    p = filtered_probs(x, [r.params])[0]
    return p / p.sum()


def snapshot_verdict(rows: torch.Tensor, r, seed: int, drafts_in_history: bool = True):
    """What the snapshot says request ``r`` emits, given the target's raw rows (k+1, V) and a
    generator seeded as the request's: (tokens, accepted)."""
    k, V = len(r.spec_token_ids), rows.shape[1]
    d = torch.tensor([r.spec_token_ids])
    if r.params.greedy:
        return tuple(rj.greedy_verify(rows.argmax(-1).tolist(), r.spec_token_ids)), None
    n = len(r.output_token_ids)
    p = torch.stack([plain_p(rows[j], r, r.output_token_ids
                             + (r.spec_token_ids[:j] if drafts_in_history else []),
                             n + j < r.min_tokens) for j in range(k + 1)])
    q = (rj.point_mass(d[0], V, torch.float32) if r.spec_draft_probs is None
         else r.spec_draft_probs)
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(k, generator=g)  # the engine's first k draws
    a, w = rj.judge(p[None], q[None], d, u[None])
    a = int(a)
    token = int(torch.multinomial(w[0], 1, generator=g)[0])
    return tuple(r.spec_token_ids[:a] + [token]), a


@functools.cache
def engine_cases(case: str):
    """REQUESTS random requests of one kind (1 to 5 proposals, a vocabulary of 16, three
    tokens of output so far), verified by the engine in one call -> (engine verdicts, rows per
    request, requests, seeds)."""
    from nanoserve.sampling.params import SamplingParams
    from nanoserve.spec_decode.rejection import verify

    n, V, most = REQUESTS, 16, 5
    g = torch.Generator().manual_seed({"greedy": 1, "draft": 2, "ngram": 3, "params": 4}[case])
    ks = torch.randint(1, most + 1, (n,), generator=g).tolist()
    logits = torch.randn(n, most + 1, V, generator=g) * 2
    q = torch.softmax(torch.randn(n, most, V, generator=g) * 2, dim=-1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=g).view(n, most)
    if case == "greedy":  # the argmax, one of them changed in most requests
        drafts = logits[:, :most].argmax(-1)
        wrong = torch.randint(0, most + 2, (n,), generator=g)  # beyond k: all right
        hit = wrong < most
        drafts[hit, wrong[hit]] = (drafts[hit, wrong[hit]] + 1) % V
    outputs = torch.randint(0, V, (n, 3), generator=g)
    if case == "params":  # a model that wants to repeat its last token, and proposals that do
        last = outputs[:, -1]
        logits[torch.arange(n), :, last] += 10
        drafts = last[:, None].expand(n, most)
        q = (q + torch.nn.functional.one_hot(last, V)[:, None]) / 2
    outputs = outputs.tolist()
    rows, reqs, seeds = [], [], []
    for i, k in enumerate(ks):
        seed = 1000 + i
        sp = SamplingParams(temperature=0 if case == "greedy" else 1.0, seed=seed)
        if case == "params":
            sp = SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05,
                                repetition_penalty=1.5, frequency_penalty=1.5,
                                presence_penalty=1.5, min_tokens=5, seed=seed)
        certain = case == "ngram" or (case == "params" and i % 2)
        draft_q = None if certain else q[i, :k].clone()
        eos = frozenset({0}) if case == "params" else frozenset()
        rows.append(logits[i, :k + 1])
        reqs.append(_request(i, sp, outputs[i], drafts[i, :k].tolist(), draft_q, eos))
        seeds.append(seed)
    return verify(torch.cat(rows), reqs), rows, reqs, seeds


def engine_agrees(case: str, drafts_in_history: bool = True) -> str:
    verdicts, rows, reqs, seeds = engine_cases(case)
    same = 0
    for v, x, r, s in zip(verdicts, rows, reqs, seeds, strict=True):
        tokens, a = snapshot_verdict(x, r, s, drafts_in_history)
        same += tuple(v.tokens) == tokens and v.num_accepted == len(tokens) - 1
    return f"{same} of {len(reqs)}"


# ------------------------------------------------------------------------ seeds


def decode(seed: int, speculate: bool, length: int = 64) -> list[int]:
    """A seeded request over the Markov chain ``P`` (logits log P[last]) through the engine's
    own sampling: ``sample_requests`` a token at a time, or ``verify`` on SEQ_K proposals along
    the draft chain (drawn by a proposer generator of its own, seeded alike every run)."""
    from nanoserve.sampling.params import SamplingParams
    from nanoserve.sampling.sampler import sample_requests
    from nanoserve.spec_decode.rejection import verify

    P_, Q_ = (c.float() for c in chains())
    sp = SamplingParams(temperature=1.0, seed=seed)
    r = _request(0, sp, [], [], None)
    proposer = torch.Generator().manual_seed(0)
    last = START
    while len(r.output_token_ids) < length:
        if not speculate:
            r.output_token_ids.append(sample_requests(P_[last].log()[None], [r])[0])
        else:
            ctx = [last]
            for _ in range(SEQ_K):
                ctx.append(int(torch.multinomial(Q_[ctx[-1]], 1, generator=proposer)[0]))
            r.spec_token_ids, r.spec_draft_probs = ctx[1:], Q_[ctx[:SEQ_K]]
            r.output_token_ids += verify(P_[ctx].log(), [r])[0].tokens
        last = r.output_token_ids[-1]
    return r.output_token_ids[:length]


def twice_equal() -> str:
    a, b = decode(7, True), decode(7, True)
    return f"{sum(x == y for x, y in zip(a, b, strict=True))} of {len(a)}"


def equal_to_plain() -> str:
    a, b = decode(7, True), decode(7, False)
    return f"{sum(x == y for x, y in zip(a, b, strict=True))} of {len(a)}"


def f2(x: float) -> str:
    return f"{x:,.2f}"


CLAIMS = [
    exact("greedy verify, argmax of the rows 5, 2, 7, 1: proposals 5, 2, 3 emit",
          lambda: ", ".join(map(str, rj.greedy_verify([5, 2, 7, 1], [5, 2, 3])))),
    exact("greedy verify, argmax of the rows 5, 2, 7, 1: proposals 5, 2, 7 emit",
          lambda: ", ".join(map(str, rj.greedy_verify([5, 2, 7, 1], [5, 2, 7])))),
    exact("acceptance rate sum_x min(p(x), q(x)), the inputs' p and q",
          lambda: f"{exact_acceptance():.2f}"),
    exact("acceptance rate measured, 100,000 steps of 4 proposals",
          lambda: f"{measured_acceptance():.4f}"),
    bound("acceptance rate, measured minus exact, absolute",
          lambda: abs(measured_acceptance() - exact_acceptance()), fmt="{:.4f}".format),
    exact("mean tokens a step emits, (1 - a^5) / (1 - a) at a = 0.73",
          lambda: f"{formula_tokens():.3f}"),
    exact("mean tokens a step emits, measured over 100,000 steps",
          lambda: f"{mean_tokens():.3f}"),
    bound("mean tokens a step emits, measured minus formula, absolute",
          lambda: abs(mean_tokens() - formula_tokens()), fmt="{:.4f}".format),
    exact("first emitted token against p, 100,000 steps: chi-square, 5 degrees of freedom",
          lambda: f2(first_token_test()[0])),
    bound("first emitted token against p: p-value", lambda: first_token_test()[2],
          fmt="{:.3f}".format),
    exact("broken rule, residual drawn from p: chi-square",
          lambda: f2(first_token_test("p")[0])),
    bound("broken rule, residual drawn from p: p-value", lambda: first_token_test("p")[2],
          fmt="{:.3g}".format),
    exact("broken rule, residual drawn from q: chi-square",
          lambda: f2(first_token_test("q")[0])),
    bound("broken rule, residual drawn from q: p-value", lambda: first_token_test("q")[2],
          fmt="{:.3g}".format),
    exact("n-gram proposal of token 2 (q a point mass): acceptance rate measured, exact p(2)",
          lambda: f"{measured_acceptance('ngram'):.4f}, {exact_acceptance('ngram'):.2f}"),
    bound("n-gram proposal of token 2: first emitted token against p, p-value",
          lambda: first_token_test(proposer="ngram")[2], fmt="{:.3f}".format),
    exact("n-gram residual normalised against p without token 2 renormalised: largest "
          "difference", lambda: f"{ngram_residual_gap():.3g}"),
    exact("first two tokens of 50,000 sequences of a Markov chain, 3 proposals a step: "
          "chi-square, 35 degrees of freedom", lambda: f2(sequence_test()[0])),
    bound("first two tokens of 50,000 sequences against the chain: p-value",
          lambda: sequence_test()[2], fmt="{:.3f}".format),
    exact("engine verify equal to the snapshot, 200 greedy requests, k from 1 to 5",
          lambda: engine_agrees("greedy")),
    exact("engine verify equal to the snapshot, 200 sampled requests with draft "
          "probabilities", lambda: engine_agrees("draft")),
    exact("engine verify equal to the snapshot, 200 sampled requests with certain "
          "(n-gram) proposals", lambda: engine_agrees("ngram")),
    exact("engine verify equal to the snapshot fed the plain step's p, 200 requests with "
          "temperature, top-k, top-p, min-p, three penalties and min_tokens",
          lambda: engine_agrees("params")),
    exact("the same, the snapshot's penalties leaving the proposals out of the history",
          lambda: engine_agrees("params", drafts_in_history=False)),
    exact("a seeded request decoded twice with speculation, 64 tokens: equal",
          twice_equal),
    exact("the same seed without speculation: tokens equal, position by position",
          equal_to_plain),
]
