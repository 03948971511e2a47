"""Prompt lookup: vLLM's n-gram proposer, the same tokens for the same config.

Why this module exists: text that quotes its own context (code edited in place, a summary that
repeats its source, a list that continues a pattern) can be guessed without a model: find where
the request's newest tokens occurred before, and propose what followed them there. The guess is
free to make and certain to state (``spec_draft_probs`` is None), so the verify step accepts a
proposal exactly when the target would have written it.

The rule, as vLLM v1's ``NgramProposer`` has it (``vllm/v1/spec_decode/ngram_proposer.py``),
over a request's tokens (prompt, then output, the newest sampled token last; ``N`` of them):

1. nothing when ``N < prompt_lookup_min``, or when ``max_model_len - N <= 0`` (vLLM skips a
   request at the end of the context, and caps ``k`` at ``max_model_len - N``);
2. the longest ``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` whose last ``n`` tokens occur
   earlier, followed by at least one token (the suffix itself does not count; overlapping it
   does);
3. of that ``n``'s occurrences, the EARLIEST (vLLM runs KMP over the reversed tokens and moves
   its position on ``>=``, so the last match it sees, the first in the original order, wins);
4. the proposal: the tokens after it, at most ``k``, fewer when fewer follow.

vLLM (0.32, as benchmarked beside nanoserve) asks only requests that sampled a token this step
and are short of ``max_model_len``; the engine core asks only decoding requests whose newest
token is sampled, and rule 1 covers the rest. (Older vLLM also skipped requests with penalties,
``min_p`` or logprobs; 0.32 does not, and neither does nanoserve.)

>>> propose_ngram([1, 2, 3, 4, 2, 3], 2, 3, k=4, max_model_len=100)  # vLLM's own example
[4, 2, 3]
>>> propose_ngram([1, 2, 9, 8, 1, 2, 7, 1, 2], 2, 2, k=2, max_model_len=100)  # earliest
[9, 8]
>>> propose_ngram([2, 3, 8, 1, 2, 3, 5, 1, 2, 3], 2, 3, k=4, max_model_len=100)  # longest
[5, 1, 2, 3]
>>> propose_ngram([5, 5, 5, 5], 2, 3, k=4, max_model_len=100)  # overlapping: [5,5,5] at 0
[5]
>>> propose_ngram([1, 2, 3, 4, 2, 3], 2, 3, k=4, max_model_len=8)  # 8 - 6 = 2 positions left
[4, 2]

``propose_ngram`` is the plain statement (a scan of every position per step). The proposer runs
``NgramIndex`` instead, equal to it by test: per request, a dict per ``n`` from each n-gram to
where it first started, grown by the new tokens only, so a step costs a few dict operations per
request whatever the context's length (the shipped model is host-bound: a Python scan of a long
context every step would cost a good share of the forward it is meant to save). Optionally a
``BackoffPolicy`` (``backoff.py``) pauses proposals for a request that keeps missing;
``NGRAM_BACKOFF`` is the default, None (vLLM's behaviour) until measured otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanoserve.spec_decode.backoff import AcceptanceBackoff, BackoffPolicy
from nanoserve.spec_decode.proposer import Proposer

if TYPE_CHECKING:
    from nanoserve.config.speculative import SpeculativeConfig
    from nanoserve.engine.request import Request

NGRAM_BACKOFF: BackoffPolicy | None = None  # nanoserve's rule for n-gram; None: vLLM's (always)
_DEFAULT = object()


def propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int,
                  max_model_len: int) -> list[int]:
    """The reference: vLLM's proposal for ``tokens``, by a plain scan."""
    total = len(tokens)
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        for s in range(total - n):  # s + n <= total - 1: at least one token follows
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


class NgramIndex:
    """One request's tokens and, for each ``n``, the first start of every n-gram that at least
    one token follows; ``extend`` adds tokens, ``propose`` indexes what it must and looks up."""

    __slots__ = ("min_n", "max_n", "tokens", "firsts", "ends")

    def __init__(self, min_n: int, max_n: int, tokens: list[int] = ()):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = list(tokens)
        self.firsts: list[dict[tuple, int]] = [{} for _ in range(max_n - min_n + 1)]
        self.ends = 0  # every n-gram ending before this position is in firsts

    def extend(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def _catch_up(self) -> None:
        t, lo, hi = self.tokens, self.ends, len(self.tokens) - 1  # new end positions [lo, hi)
        if hi - lo <= 8:  # a step's few tokens: one n-gram per end and n, no generators
            for e in range(lo, hi):
                for n, firsts in enumerate(self.firsts, self.min_n):
                    if e >= n - 1:
                        firsts.setdefault(tuple(t[e - n + 1:e + 1]), e - n + 1)
        else:  # a prompt: each n's n-grams as zipped slices, in C
            for n, firsts in enumerate(self.firsts, self.min_n):
                s0, s1 = max(0, lo - n + 1), hi - n + 1  # their starts [s0, s1)
                if s1 <= s0:
                    continue
                keys = zip(*(t[s0 + j:s1 + j] for j in range(n)), strict=True)  # n-tuples
                if firsts:  # later starts: only a new n-gram goes in
                    for key, s in zip(keys, range(s0, s1), strict=True):
                        firsts.setdefault(key, s)
                else:  # built backwards so that the earliest start is written last and stays
                    firsts.update(zip(reversed(list(keys)), range(s1 - 1, s0 - 1, -1),
                                      strict=True))
        self.ends = max(lo, hi)

    def propose(self, k: int, max_model_len: int) -> list[int]:
        """``propose_ngram(self.tokens, ...)``, from the index."""
        t = self.tokens
        total = len(t)
        k = min(k, max_model_len - total)
        if total < self.min_n or k <= 0:
            return []
        self._catch_up()
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            s = self.firsts[n - self.min_n].get(tuple(t[total - n:]))
            if s is not None:
                return t[s + n:s + n + k]
        return []


class NgramProposer(Proposer):
    """Prompt lookup for every decoding request, one ``NgramIndex`` each, kept between steps
    and forgotten once the request is no longer asked for."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int,
                 backoff: BackoffPolicy | None = _DEFAULT):
        super().__init__(config)
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self.max_model_len = max_model_len
        policy = NGRAM_BACKOFF if backoff is _DEFAULT else backoff
        self.backoff = AcceptanceBackoff(policy) if policy is not None else None
        self.indexes: dict[str, tuple[Request, NgramIndex]] = {}

    @classmethod
    def create(cls, config: SpeculativeConfig, loaded) -> NgramProposer:
        return cls(config, loaded.max_model_len)

    def describe(self) -> str:
        rule = (f"; backing off after {self.backoff.policy.after} missed steps"
                if self.backoff else "")
        return (f"ngram (prompt lookup, n in [{self.min_n}, {self.max_n}]), {self.k} tokens a "
                f"step{rule}")

    def _index(self, r: Request) -> NgramIndex:
        """``r``'s index, brought up to its tokens (built afresh for a new request object)."""
        held = self.indexes.get(r.request_id)
        prompt, out = r.prompt_token_ids, r.output_token_ids
        if held is not None and held[0] is r:
            index = held[1]
            have = len(index.tokens) - len(prompt)  # output tokens indexed
            if 0 <= have <= len(out):
                index.extend(out[have:])
                return index
        index = NgramIndex(self.min_n, self.max_n, prompt + out)
        self.indexes[r.request_id] = (r, index)
        return index

    def propose(self, requests: list[Request]) -> None:
        for r in requests:
            if self.backoff is not None and not self.backoff.gate(r):
                r.spec_token_ids = []
            else:
                r.spec_token_ids = self._index(r).propose(self.k, self.max_model_len)
                if self.backoff is not None and r.spec_token_ids:
                    self.backoff.record(r, r.spec_token_ids)
            r.spec_draft_probs = None
        ids = [r.request_id for r in requests]  # the gone (finished, preempted) are forgotten
        self.indexes = {i: self.indexes[i] for i in ids if i in self.indexes}
        if self.backoff is not None:
            self.backoff.retain(ids)

    def release(self, request: Request) -> None:
        self.indexes.pop(request.request_id, None)
        if self.backoff is not None:
            self.backoff.forget(request.request_id)
