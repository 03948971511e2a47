"""Prompt logprobs (vLLM's ``prompt_logprobs``): the LM head over the prompt, not only its end.

Why this module exists: a prefill normally runs the LM head at one position per request, its
last, because only that row is sampled. A request with ``SamplingParams.prompt_logprobs = k``
wants more: for every prompt position p >= 1, the raw model's logprob of prompt token p given
tokens 0 .. p-1, its rank, and the top k there. Those come from the logits at positions
0 .. P-2 (P the prompt's length), which its prefill computes hidden states for anyway; this
module says which of a step's positions each row needs (``plan``) and turns those rows of logits
into ``TokenLogprob`` entries on ``Request.prompt_logprobs`` (``record``).

A chunk ``[start, start + n)`` of a chunked prefill contributes the positions it computes, so
the entries arrive in order, chunk by chunk. Positions already recorded are never asked for
again: a request preempted and resumed re-prefills its prompt but keeps its entries. Such a
request never starts from the prefix cache (``KVCacheManager.find_prefix``, as vLLM skips the
cache for it): the logits of cached positions would never be computed.

>>> positions(start=0, n=4, prompt_len=6, done=0)  # logits at 0..3 score prompt tokens 1..4
(0, 4)
>>> positions(start=4, n=3, prompt_len=6, done=4)  # position 4 scores token 5; 5 is sampled
(4, 5)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanoserve.sampling.sampler import token_logprobs

if TYPE_CHECKING:
    from nanoserve.engine.request import Request


def positions(start: int, n: int, prompt_len: int, done: int) -> tuple[int, int]:
    """``[lo, hi)``: the positions of ``[start, start + n)`` whose logits score a prompt token
    not yet scored (``done`` entries so far, for positions 0 .. done-1); empty as (lo, lo)."""
    lo, hi = max(start, done), min(start + n, prompt_len - 1)
    return (lo, hi) if lo < hi else (lo, lo)


def _range(r: Request, start: int, n: int) -> tuple[int, int]:
    if r.params is None or r.params.prompt_logprobs is None:
        return (0, 0)
    return positions(start, n, len(r.prompt_token_ids), len(r.prompt_logprobs))


def plan(requests: list[Request], starts: list[int], lens: list[int]) -> list[int] | None:
    """How many trailing positions' logits each row of a forward needs (``want``, as
    ``Engine.score`` takes it): from its first unscored prompt position through its last token,
    for a row that scores prompt tokens; 1 (its last) for every other row. None when no row
    scores any, so the step takes its usual path untouched."""
    want, any_ = [], False
    for r, s, n in zip(requests, starts, lens, strict=True):
        lo, hi = _range(r, s, n)
        want.append(s + n - lo if hi > lo else 1)
        any_ = any_ or hi > lo
    return want if any_ else None


def record(logits: torch.Tensor, requests: list[Request], starts: list[int], lens: list[int],
           want: list[int]) -> torch.Tensor:
    """logits (sum(want), V), each row's last ``want[b]`` positions -> each row's last-position
    logits (B, V); appends the prompt entries the rows scored to ``Request.prompt_logprobs``."""
    ends = torch.tensor(want).cumsum(0).tolist()
    index, targets, ks, owners = [], [], [], []
    for b, r in enumerate(requests):
        lo, hi = _range(r, starts[b], lens[b])
        first = ends[b] - want[b]  # the row of position starts[b] + lens[b] - want[b] == lo
        for p in range(lo, hi):
            index.append(first + p - lo)
            targets.append(r.prompt_token_ids[p + 1])
            ks.append(r.params.num_prompt_logprobs)
            owners.append(r)
    if index:
        dev = logits.device
        entries = token_logprobs(logits[torch.tensor(index, device=dev)],
                                 torch.tensor(targets, device=dev), ks)
        for r, e in zip(owners, entries, strict=True):
            r.prompt_logprobs.append(e)
    return logits[torch.tensor([e - 1 for e in ends], device=logits.device)]


def record_whole(compute_logits, hidden: torch.Tensor, request: Request) -> None:
    """Without a KV cache (Day 4) each step runs the whole sequence, hidden (T, E): score the
    prompt positions not yet scored through ``compute_logits``."""
    lo, hi = _range(request, 0, request.num_tokens)
    if hi > lo:  # positions lo .. hi: the last is only there to close the row
        record(compute_logits(hidden[lo:hi + 1]), [request], [0], [hi + 1], [hi + 1 - lo])
