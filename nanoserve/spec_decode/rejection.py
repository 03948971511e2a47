"""The rejection sampler: which proposals the target keeps, and the token it adds.

Why this module exists: speculation is only allowed if it changes nothing a user can observe.
A request with k proposals ``d_0 .. d_{k-1}`` comes with 1 + k rows of the target's logits: row
j is the target's view of the token after its output and ``d_0 .. d_{j-1}``. Each row is
processed exactly as a plain step would process it (``sampler.process_logits``: the penalties
over that position's history, ``min_tokens``' masked stop ids, the grammar's mask at that
position), so ``p_j``, the distribution row j is drawn from, is the one the request would have
met had it generated ``d_0 .. d_{j-1}`` itself.

Greedy requests keep proposals while each equals the argmax of its processed row and then add
the argmax at the first mismatch (or after the last proposal: the bonus token); no randomness.

Sampled requests follow Leviathan et al. (2023) and Chen et al. (2023). ``q_j`` is the
proposer's distribution for ``d_j`` (``Request.spec_draft_probs``, or a point mass on ``d_j``
when the proposer is certain, as n-gram lookup is). ``d_j`` is kept with probability
``min(1, p_j(d_j) / q_j(d_j))``; at the first rejection the target draws its own token from
``max(0, p_j - q_j)`` normalised (``residual``), and when all k are kept it draws the bonus
from ``p_k``. Whatever ``q`` is, each emitted token is then distributed exactly as ``p``: the
kept mass ``min(p, q)`` plus the residual's share ``p - min(p, q)`` is ``p``. Every request
draws k uniforms and one token from its own generator, so a seeded request repeats itself given
the same proposals (it need not repeat the text it writes without speculation: the random
numbers are spent differently).

Structured outputs: the grammar is walked ahead through the proposals it allows
(``validate_tokens``, then ``consume_token`` one at a time to fill each position's mask) and
rolled back, so the matcher is left as it was found; ``Request.append_token`` consumes what is
emitted. The first proposal the grammar refuses has ``p_j(d_j) = 0`` under its position's mask
and is rejected like any other. Positions after the grammar has stopped are never emitted (the
request finishes on the token that stops it), so no mask is needed there.

The common case, greedy requests with no penalty, ``logit_bias``, ``min_tokens``, grammar or
logprobs, is one argmax over all their rows and a Python compare: the host's time per step is
what the shipped 3.4M-parameter model spends most of. A request with any of them takes the
general path, whose rows all go through ``process_logits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nanoserve.sampling.sampler import (
    banned_stops,
    filtered_probs,
    greedy,
    process_logits,
    token_logprobs,
)

if TYPE_CHECKING:
    from nanoserve.engine.request import Request
    from nanoserve.sampling.sampler import TokenLogprob


@dataclass(slots=True)
class Verdict:
    """One request's verify: the tokens to emit, in order (its accepted proposals, then one
    token of the target's own), how many proposals were accepted, and each emitted token's
    logprob entry when the request asked for logprobs (else None)."""

    tokens: list[int]
    num_accepted: int
    logprobs: list[TokenLogprob] | None = None


def verify(logits: torch.Tensor, requests: list[Request]) -> list[Verdict]:
    """logits (N, V) float32, raw: request i owns 1 + k_i consecutive rows (k_i its
    ``len(spec_token_ids)``), the target's logits after its last token and after each of its
    proposals. One ``Verdict`` per request."""
    ks = [len(r.spec_token_ids) for r in requests]
    if sum(ks) + len(requests) != logits.shape[0]:
        raise ValueError(f"verify: {logits.shape[0]} rows of logits for {len(requests)} "
                         f"requests with {sum(ks)} proposals (want one more row per request)")
    starts, at = [], 0
    for k in ks:
        starts.append(at)
        at += k + 1
    out: list[Verdict | None] = [None] * len(requests)
    fast = [i for i, r in enumerate(requests) if _plain_greedy(r)]
    if fast:
        _verify_fast(logits, requests, fast, starts, ks, out)
    if len(fast) < len(requests):
        taken = set(fast)
        _verify_general(logits, requests, [i for i in range(len(requests)) if i not in taken],
                        starts, ks, out)
    return out


def _plain_greedy(r: Request) -> bool:
    """Greedy with nothing that edits its logits (no penalty, logit bias, banned stop or
    grammar) and no logprobs: the argmax of the raw rows."""
    sp = r.params
    return (sp.greedy and not sp.penalised and not sp.logit_bias and sp.logprobs is None
            and len(r.output_token_ids) >= r.min_tokens
            and getattr(r, "matcher", None) is None)


def _accepted_greedy(drafts: list[int], best: list[int], limit: int) -> int:
    """How many leading proposals (at most ``limit``) equal the target's argmax."""
    a = 0
    while a < limit and drafts[a] == best[a]:
        a += 1
    return a


def _verify_fast(logits, requests, which, starts, ks, out) -> None:
    """Plain greedy requests: one argmax over their rows, then a compare per request."""
    if len(which) == len(requests):  # the common case: every row, no gather
        best, base = greedy(logits).tolist(), starts  # (N,)
    else:
        index, base = [], [0] * len(requests)
        for i in which:
            base[i] = len(index)
            index += range(starts[i], starts[i] + ks[i] + 1)
        best = greedy(logits[torch.tensor(index, device=logits.device)]).tolist()
    for i in which:
        drafts, b, k, a = requests[i].spec_token_ids, base[i], ks[i], 0
        while a < k and drafts[a] == best[b + a]:
            a += 1
        out[i] = Verdict(drafts[:a] + [best[b + a]], a)


def _walk_grammar(matcher, drafts: list[int], V: int) -> tuple[int, torch.Tensor]:
    """Walk ``matcher`` through the proposals its grammar allows and back. Returns T, the
    proposals consumed (positions 0 .. T are reachable; a proposal at T < k is refused or
    follows a stop), and the masks of positions 0 .. T, (T + 1, ceil(V / 32)), less position T's
    when the grammar stopped there. The matcher is left in the state it was found in."""
    from nanoserve.structured.mask import fill

    limit = matcher.validate_tokens(drafts)
    masks = [fill([matcher], V)]  # (1, W) each
    T = 0
    try:
        while T < limit and not matcher.is_stopped():
            if not matcher.consume_token(drafts[T]):
                raise RuntimeError(f"grammar refused proposal {drafts[T]} that it had validated "
                                   f"({matcher.get_error()})")
            T += 1
            if not matcher.is_stopped():  # past a stop nothing is emitted: no mask needed
                masks.append(fill([matcher], V))
    finally:
        if T and not matcher.rollback(T):
            raise RuntimeError(f"grammar could not roll back {T} tokens ({matcher.get_error()})")
    return T, torch.cat(masks)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,) target and proposer distributions -> the weights of the token the target draws
    after a rejection, ``max(0, p - q)`` (``torch.multinomial`` normalises them)."""
    return (p - q).clamp_(min=0)


def _draw_sampled(r: Request, p: torch.Tensor, T: int) -> tuple[int, int]:
    """p (T + 1, V): the target's distributions at positions 0 .. T (T <= k; a proposal at
    position T < k is refused, the grammar having refused it or stopped before it).
    Returns (accepted, the target's token)."""
    drafts, q = r.spec_token_ids, r.spec_draft_probs
    k, dev, g = len(drafts), p.device, r.generator
    u = torch.rand(k, generator=g, device=dev)  # (k,): always k, so a seed repeats itself
    n = min(T, k)
    d = torch.tensor(drafts[:n], dtype=torch.long, device=dev)
    p_d = p[torch.arange(n, device=dev), d]  # (n,)
    if q is None:  # a certain proposer: q_j is a point mass on d_j
        keep = u[:n] < p_d
    else:
        if tuple(q.shape) != (k, p.shape[1]):
            raise ValueError(f"spec_draft_probs: want ({k}, {p.shape[1]}), one row per proposal "
                             f"over the target's vocabulary; got {tuple(q.shape)}")
        q = q.to(dev, torch.float32)
        q_d = q[torch.arange(n, device=dev), d]
        keep = (q_d > 0) & (u[:n] * q_d < p_d)  # u < p / q, without dividing by a zero q
    rejected = (~keep).nonzero()
    a = int(rejected[0, 0]) if len(rejected) else n
    if a == k:  # every proposal kept: the bonus token from p_k
        return a, int(torch.multinomial(p[k], 1, generator=g)[0])
    if q is None:
        q_a = torch.zeros_like(p[a])
        q_a[drafts[a]] = 1.0
    else:
        q_a = q[a]
    w = residual(p[a], q_a)
    if not w.sum() > 0:  # p_a <= q_a everywhere: only float rounding; draw from p_a itself
        w = p[a]
    return a, int(torch.multinomial(w, 1, generator=g)[0])


def _verify_general(logits, requests, which, starts, ks, out) -> None:
    """Every other request: each position's row processed as a plain step would, then judged."""
    V = logits.shape[1]
    index, params, prompts, outputs, banned = [], [], [], [], []
    g_rows, g_words = [], []
    first, reach = [], []  # each request's first processed row, and its T
    for i in which:
        r = requests[i]
        drafts, T = r.spec_token_ids, ks[i]
        matcher = getattr(r, "matcher", None)
        if matcher is not None:
            T, words = _walk_grammar(matcher, drafts, V)
            g_rows += range(len(index), len(index) + words.shape[0])
            g_words.append(words)
        first.append(len(index))
        reach.append(T)
        n_out = len(r.output_token_ids)
        for j in range(T + 1):
            index.append(starts[i] + j)
            params.append(r.params)
            prompts.append(r.prompt_token_ids)
            outputs.append(r.output_token_ids + drafts[:j] if j else r.output_token_ids)
            banned.append(banned_stops(r, n_out + j, V))
    raw = logits[torch.tensor(index, device=logits.device)]  # (R, V)
    grammar = (g_rows, torch.cat(g_words)) if g_rows else None
    x = process_logits(raw, params, prompts, outputs, banned, grammar)  # (R, V)
    sampled = [n for n, i in enumerate(which) if not requests[i].params.greedy]
    probs = best = None
    if sampled:
        rows = [first[n] + j for n in sampled for j in range(reach[n] + 1)]
        probs = filtered_probs(x[rows], [params[m] for m in rows])  # (R_s, V)
        # top-p and min-p zero tokens without renormalising (multinomial needs no sum of 1);
        # p_j(d_j) / q_j(d_j) and p_j - q_j need the distribution itself
        probs = probs / probs.sum(dim=-1, keepdim=True)
        at, where = 0, {}
        for n in sampled:
            where[n] = at
            at += reach[n] + 1
    if len(sampled) < len(which):
        best = greedy(x).tolist()  # (R,): the sampled rows' argmax is not read
    lp_rows, lp_tokens, lp_ks, lp_owner = [], [], [], []
    for n, i in enumerate(which):
        r, T, drafts = requests[i], reach[n], requests[i].spec_token_ids
        if r.params.greedy:
            row = best[first[n]:first[n] + T + 1]
            a = _accepted_greedy(drafts, row, min(T, ks[i]))
            token = row[a]
        else:
            a, token = _draw_sampled(r, probs[where[n]:where[n] + T + 1], T)
        emitted = drafts[:a] + [token]
        out[i] = Verdict(emitted, a)
        if r.params.logprobs is not None:
            lp_rows += range(starts[i], starts[i] + a + 1)
            lp_tokens += emitted
            lp_ks += [r.params.logprobs] * (a + 1)
            lp_owner += [i] * (a + 1)
    if lp_rows:  # from the raw logits, as a plain step reads them
        entries = token_logprobs(logits[torch.tensor(lp_rows, device=logits.device)],
                                 torch.tensor(lp_tokens, device=logits.device), lp_ks)
        for i, e in zip(lp_owner, entries, strict=True):
            if out[i].logprobs is None:
                out[i].logprobs = []
            out[i].logprobs.append(e)
