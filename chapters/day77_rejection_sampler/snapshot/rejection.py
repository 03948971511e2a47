"""Day 77 snapshot (frozen): which proposals the target keeps, and the token it adds.

A verify step gives the target's view of 1 + k positions at once: row j of ``p`` is the
target's distribution for the token after the request's text and the proposals ``d_0 ..
d_{j-1}``. Row j of ``q`` is the proposer's distribution for ``d_j`` (a point mass on ``d_j``
when the proposer is certain, as an n-gram lookup is).

Greedy: keep proposals while each is the argmax of its row; at the first mismatch emit the
argmax instead and stop; when all k pass, emit the argmax of the last row too (the bonus).

Sampled (Leviathan et al.; Chen et al.): keep ``d_j`` with probability ``min(1, p_j(d_j) /
q_j(d_j))``, tested as ``u_j q_j(d_j) < p_j(d_j)`` with ``u_j`` uniform on [0, 1), so no division
by zero; at the first rejection draw from ``max(0, p_j - q_j)`` normalised, and when all k are
kept draw the bonus from ``p_k``. Either way the token emitted at each position is distributed
exactly as ``p_j``.

Every random number comes in as an argument (``u`` for the k tests, ``v`` for the one draw), so
the rule is a pure function and the experiments in ``claims.py`` are repeatable to the bit.

>>> import torch
>>> greedy_verify([5, 2, 7, 1], [5, 2, 3])    # the third proposal is not the argmax
[5, 2, 7]
>>> greedy_verify([5, 2, 7, 1], [5, 2, 7])    # all three pass: the bonus token 1 follows
[5, 2, 7, 1]
>>> p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
>>> q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
>>> acceptance_rate(p, q).item()               # 0.2 + 0.3 + 0.2
0.7
>>> residual(p, q).tolist()                    # only token 0 has more p than q
[[0.3, 0.0, 0.0]]
>>> residual(p, point_mass(torch.tensor([1]), 3, p.dtype)).tolist()  # n-gram: p less d = 1
[[0.5, 0.0, 0.2]]

One request, one proposal ``d_0 = 2``, two rows of ``p``: with ``u = 0.3``, ``0.3 * 0.5 < 0.2``
keeps it and the bonus comes from ``p_1``; with ``u = 0.5`` it is rejected and the residual,
all on token 0, decides.

>>> P = torch.stack([p, p], dim=1)             # (T=1, k+1=2, V=3)
>>> rejection_sample(P, q[:, None], torch.tensor([[2]]), torch.tensor([[0.3]]),
...                  torch.tensor([0.9]))
(tensor([[2, 2]]), tensor([1]))
>>> rejection_sample(P, q[:, None], torch.tensor([[2]]), torch.tensor([[0.5]]),
...                  torch.tensor([0.9]))
(tensor([[ 0, -1]]), tensor([0]))

Greedy is the rule's limit: a one-hot ``p`` at the argmax against a one-hot ``q`` at each
proposal keeps a proposal with probability 1 or 0, and the residual is the argmax itself.

>>> best, drafts = torch.tensor([[5, 2, 7, 1]]), torch.tensor([[5, 2, 3]])
>>> hot_p, hot_q = point_mass(best, 8, torch.float64), point_mass(drafts, 8, torch.float64)
>>> rejection_sample(hot_p, hot_q, drafts, torch.rand(1, 3), torch.rand(1))[0].tolist()
[[5, 2, 7, -1]]
"""

from __future__ import annotations

import torch


def greedy_verify(best: list[int], drafts: list[int]) -> list[int]:
    """best: the argmax of each of the 1 + k rows; drafts: the k proposals -> tokens to emit."""
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return drafts[:a] + [best[a]]


def point_mass(tokens: torch.Tensor, V: int, dtype: torch.dtype) -> torch.Tensor:
    """tokens (...) -> (..., V): probability one on each token, the ``q`` of a certain proposer."""
    return torch.nn.functional.one_hot(tokens, V).to(dtype)


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (...): the chance a proposal drawn from q is kept, sum_x min(p(x), q(x))."""
    return torch.minimum(p, q).sum(dim=-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (..., V): the weights the target draws from after a rejection, max(0, p - q)
    (not normalised; ``draw`` divides by the total)."""
    return (p - q).clamp(min=0)


def draw(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w (T, V) non-negative weights, v (T,) uniform on [0, 1) -> (T,) tokens: the first token
    whose cumulative weight passes v times the total (inverse CDF). A zero weight is never
    drawn: its cumulative equals the token's before it, which would have passed first."""
    c = w.cumsum(dim=-1)  # (T, V)
    t = (v * c[:, -1])[:, None]  # (T, 1)
    return torch.searchsorted(c, t, right=True)[:, 0].clamp(max=w.shape[-1] - 1)


def judge(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor,
          residual=residual) -> tuple[torch.Tensor, torch.Tensor]:
    """p (T, k+1, V), q (T, k, V), drafts (T, k), u (T, k) -> (accepted (T,), w (T, V)): how
    many leading proposals are kept, and the weights of the token the target adds after them
    (``residual(p_a, q_a)`` at a rejection, ``p_k`` when all k are kept). ``residual`` is an
    argument so that a broken rule can be tried in its place."""
    T, k = drafts.shape
    rows = torch.arange(T)
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # (T, k)
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)  # (T, k)
    keep = u * q_d < p_d  # u < p/q: kept with probability min(1, p/q)
    a = keep.long().cumprod(dim=-1).sum(dim=-1)  # (T,): the leading run of kept proposals
    p_a = p[rows, a]  # (T, V)
    q_a = q[rows, a.clamp(max=k - 1)]  # (T, V); unused where a == k
    w = torch.where((a == k)[:, None], p_a, residual(p_a, q_a))
    empty = w.sum(dim=-1, keepdim=True) <= 0  # p_a <= q_a everywhere: rounding only
    return a, torch.where(empty, p_a, w)


def rejection_sample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor,
                     v: torch.Tensor, residual=residual) -> tuple[torch.Tensor, torch.Tensor]:
    """One verify step for T requests -> (tokens (T, k+1), accepted (T,)): each row holds the
    kept proposals, then the target's own token, then -1 where nothing was emitted."""
    T, k = drafts.shape
    a, w = judge(p, q, drafts, u, residual)
    tokens = torch.full((T, k + 1), -1, dtype=torch.long)
    j = torch.arange(k)
    tokens[:, :k] = torch.where(j < a[:, None], drafts, -1)
    tokens[torch.arange(T), a] = draw(w, v)
    return tokens, a


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens a step emits when each proposal is kept with probability alpha, on its own:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
