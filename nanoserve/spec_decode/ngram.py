"""Prompt lookup (placeholder: the full proposer replaces this file)."""

from __future__ import annotations

from nanoserve.spec_decode.proposer import Proposer


def propose_ngram(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for i in range(len(tokens) - n):
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k]
    return []


class NgramProposer(Proposer):
    def propose(self, requests) -> None:
        c = self.config
        for r in requests:
            r.spec_token_ids = propose_ngram(r.token_ids, c.prompt_lookup_min,
                                             c.prompt_lookup_max, self.k)
            r.spec_draft_probs = None
