"""The rejection sampler: which proposals the target keeps, and the token it adds.

Why this module exists: speculation is only allowed if it changes nothing a user can observe.
(Interface placeholder: greedy only; the full sampler replaces this file.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

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
    out, at = [], 0
    for r in requests:
        k = len(r.spec_token_ids)
        best = logits[at:at + k + 1].argmax(dim=-1).tolist()
        at += k + 1
        a = 0
        while a < k and r.spec_token_ids[a] == best[a]:
            a += 1
        out.append(Verdict(r.spec_token_ids[:a] + [best[a]], a))
    return out
