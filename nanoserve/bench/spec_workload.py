"""The workloads of ``nanoserve bench spec``: prompts whose continuation is, or is not, in them.

Why this module exists: prompt lookup (the n-gram proposer) can only pay where the text to come
is already written earlier in the sequence, so a speed-up measured on one kind of prompt says
nothing about another. Issue 41 sets a target for each kind, and each kind is defined here, once,
deterministically (same arguments, same token ids, on every machine):

- ``copy_heavy``: a passage of the shipped model's own training text (``text_loss.corpus()``):
  a window of ``passage_len`` tokens of a document (the first window starts with BOS), followed
  by its opening again (its first ``reopen`` tokens after BOS). The model has read the passage;
  having just seen its opening repeated, its greedy continuation repeats what follows, which
  the prompt holds, so lookup proposes it. ``split="val"`` takes the passages from the held-out
  topics instead: the model never trained on them, so whether it copies them is its in-context
  skill only (eight documents are held out, so their windows are sampled, not whole documents).
- ``no_repeat``: ``prompt_len`` distinct token ids (never BOS or EOS) in a seeded random order:
  no n-gram of any length occurs twice in the prompt, so whatever lookup finds it finds in the
  model's own output (a model that loops gives it something; the report says how much).
- ``forced_repeat``: for a random-weight model (the SmolLM2-135M shape), whose greedy output no
  text predicts. ``X`` is ``no_repeat``'s prompt; ``G`` its greedy continuation of ``m + n``
  tokens, computed with speculation off; the prompt is ``X + G[:m]`` and its greedy continuation
  is, in exact arithmetic, ``G[m:m + n]`` (the reference; in bf16 the prompt's prefill rounds
  otherwise than the decode steps that wrote ``G``, so the report gives the leading tokens each
  arm shares with it, and holds every arm to the off arm's output). Lookup finds that
  continuation in the prompt when ``G`` repeats itself, and random weights' greedy output does:
  it settles into one token (or two) repeated within a few steps (likely because, with a tied
  head and small random layers, the residual stream keeps the input token's embedding, whose
  logit is then the largest); ``m`` tokens of it in the prompt give lookup its match. The
  report records how many distinct tokens the continuation holds, so a reader sees how
  degenerate the text is: this workload measures the verify step's cost at a known acceptance,
  not the model.

>>> w = no_repeat(2, 6, vocab_size=50, seed=0)
>>> [len(p) for p in w.prompts], all(len(set(p)) == len(p) for p in w.prompts)
([6, 6], True)
>>> reopened([0, 5, 6, 7, 8], 2)
[0, 5, 6, 7, 8, 5, 6]
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from nanoserve.config import DEFAULT_MODEL

SPECIAL_IDS = (0, 1)  # nanoserve-tiny's BOS and EOS; never drawn into a random prompt


@dataclass
class SpecWorkload:
    """Token-id prompts, each request's output budget, and what they are (for the report)."""

    name: str  # copy-heavy-train, copy-heavy-val, no-repeat, forced-repeat
    prompts: list[list[int]]
    max_tokens: int
    description: str
    sources: list = field(default_factory=list)  # [document, offset] pairs, or seeds
    references: list[list[int]] | None = None  # the greedy outputs, where known beforehand

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]

    def head(self, n: int, max_tokens: int | None = None) -> SpecWorkload:
        """The first ``n`` requests, budgets capped at ``max_tokens`` (a warm-up)."""
        refs = None if self.references is None else self.references[:n]
        return SpecWorkload(self.name, self.prompts[:n], min(self.max_tokens, max_tokens or
                                                             self.max_tokens),
                            self.description, self.sources[:n], refs)

    def describe(self) -> dict:
        return {"name": self.name, "requests": len(self.prompts), "max_tokens": self.max_tokens,
                "prompt_lens": [min(self.prompt_lens), max(self.prompt_lens)],
                "description": self.description, "sources": self.sources}


@lru_cache(maxsize=1)
def _encoded_corpus(model_dir: str) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every training and held-out document as token ids (BOS first), encoded once."""
    from nanoserve.model.text_loss import corpus
    from nanoserve.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model_dir)
    return tuple(tuple(tuple(tok.encode(d)) for d in docs) for docs in corpus())


def split_docs(split: str, model_dir: Path = DEFAULT_MODEL) -> tuple[tuple[int, ...], ...]:
    """The ``train`` or ``val`` documents of ``text_loss.corpus()``, encoded."""
    if split not in ("train", "val"):
        raise ValueError(f"split={split!r}; choose 'train' or 'val'")
    train, val = _encoded_corpus(str(model_dir))
    return train if split == "train" else val


def reopened(passage: list[int], reopen: int) -> list[int]:
    """``passage`` followed by its opening again: the ``reopen`` tokens after its BOS (or its
    first ``reopen`` tokens when it has no BOS)."""
    start = 1 if passage and passage[0] == SPECIAL_IDS[0] else 0
    if not 1 <= reopen <= len(passage) - start:
        raise ValueError(f"reopen={reopen}: a passage of {len(passage)} tokens has "
                         f"{len(passage) - start} to reopen with")
    return list(passage) + list(passage[start:start + reopen])


def copy_heavy(split: str, requests: int, passage_len: int = 192, reopen: int = 24,
               max_tokens: int = 64, seed: int = 0,
               model_dir: Path = DEFAULT_MODEL) -> SpecWorkload:
    """``requests`` prompts, each a passage of ``passage_len`` tokens of a document of
    ``split`` followed by its opening (``reopened``). The passages are a seeded sample of every
    document's non-overlapping windows (the first at the document's start, BOS included) that
    leave ``max_tokens`` of the document after them: what the model would copy."""
    docs = split_docs(split, model_dir)
    windows = [(i, s) for i, d in enumerate(docs)
               for s in range(0, len(d) - passage_len - max_tokens + 1, passage_len)]
    if len(windows) < requests:
        raise ValueError(f"copy_heavy({split!r}): {len(windows)} passages of {passage_len} "
                         f"tokens leave {max_tokens} after them, {requests} requests asked")
    picked = sorted(random.Random(seed).sample(windows, requests))
    prompts = [reopened(list(docs[i][s:s + passage_len]), reopen) for i, s in picked]
    held = "held-out (val)" if split == "val" else "training"
    return SpecWorkload(
        f"copy-heavy-{split}", prompts, max_tokens,
        f"{held} passage of {passage_len} tokens (a document's window), then its first "
        f"{reopen} again (after BOS); {max_tokens} new tokens", [list(w) for w in picked])


def no_repeat(requests: int, prompt_len: int, vocab_size: int = 2048, max_tokens: int = 64,
              seed: int = 0) -> SpecWorkload:
    """``requests`` prompts of ``prompt_len`` distinct random ids (no BOS, no EOS): no n-gram
    occurs twice in a prompt, so the prompt gives lookup nothing."""
    pool = [t for t in range(vocab_size) if t not in SPECIAL_IDS]
    if prompt_len > len(pool):
        raise ValueError(f"prompt_len={prompt_len}: only {len(pool)} distinct ids to draw")
    prompts = [random.Random(seed * 1_000_003 + i).sample(pool, prompt_len)
               for i in range(requests)]
    return SpecWorkload("no-repeat", prompts, max_tokens,
                        f"{prompt_len} distinct random ids (no id twice: no n-gram repeats in "
                        f"the prompt); {max_tokens} new tokens",
                        [seed * 1_000_003 + i for i in range(requests)])


def forced_repeat(greedy, requests: int, prompt_len: int, vocab_size: int, m: int = 32,
                  max_tokens: int = 64, seed: int = 0) -> SpecWorkload:
    """``X + G[:m]`` for each ``no_repeat`` prompt ``X``, ``G = greedy(X, m + max_tokens)``
    (``greedy(prompts, n) -> outputs``: the target with speculation off); the references are
    ``G[m:]``, the continuation every arm must reproduce."""
    base = no_repeat(requests, prompt_len, vocab_size, m + max_tokens, seed)
    outs = greedy(base.prompts, m + max_tokens)
    prompts = [x + list(g[:m]) for x, g in zip(base.prompts, outs, strict=True)]
    refs = [list(g[m:m + max_tokens]) for g in outs]
    distinct = sorted({len(set(r)) for r in refs})
    return SpecWorkload(
        "forced-repeat", prompts, max_tokens,
        f"X ({prompt_len} distinct random ids) + the target's own greedy G(X)[:{m}]; the "
        f"continuation is G(X)[{m}:{m + max_tokens}], computed with speculation off "
        f"(distinct tokens in it: {distinct})", base.sources, refs)


def distinct_tokens(outputs: list[list[int]]) -> list[int]:
    """How many distinct ids each output holds (1: one token repeated)."""
    return [len(set(o)) for o in outputs]
