"""Day 68's numbers: what a grammar costs a decode step and a new request, and what the
compile-once cache and the C++ mask op save.

The engine is the shipped nanoserve-tiny in float32 through ``LLM`` with 8 slots; the
constrained rows carry ``nanoserve.bench.structured.LONG_SCHEMA`` (an array that needs 50
objects, so no row closes it within the 64 tokens of a round) and every row ignores EOS, so
both arms generate the same number of tokens. The timed rows run in interleaved rounds in one
process (``nanoserve bench structured``'s functions); the cache rows are counts from the
backend's own counters, held against the frozen LRU.
"""

from __future__ import annotations

import functools
import random

from chapters.common import SHIPPED
from chapters.runner import exact, timed

from .snapshot.templates import TemplateLRU

ROWS, CONSTRAINED, TOKENS = 8, 4, 64
CAPACITY, SPECS, REQUESTS = 16, 40, 300
BIG_VOCAB = 131072


@functools.cache
def llm():
    from nanoserve import LLM

    return LLM(SHIPPED, dtype="float32", max_num_seqs=ROWS)


@functools.cache
def overhead() -> dict:
    from nanoserve.bench.structured import overhead as measure

    return measure(llm(), ROWS, CONSTRAINED, TOKENS, rounds=5)


def stream() -> list[int]:
    """300 requests over 40 specs, seeded, skewed: spec i drawn with weight 1 / (i + 1)."""
    rng = random.Random(68)
    return rng.choices(range(SPECS), weights=[1 / (i + 1) for i in range(SPECS)], k=REQUESTS)


@functools.cache
def cache_counts() -> dict:
    """The stream through a fresh backend of capacity 16, and through the frozen LRU."""
    from nanoserve.structured.backend import GrammarBackend
    from nanoserve.structured.params import StructuredOutputsParams

    core = llm().core
    backend = GrammarBackend.for_tokenizer(core.tokenizer, core.vocab_size, core.eos_token_ids)
    backend.capacity = CAPACITY
    frozen = TemplateLRU(CAPACITY)
    for i in stream():
        backend.matcher(StructuredOutputsParams(regex=f"item {i}: [a-z]{{1,{i + 1}}}"))
        frozen.request(str(i))
    return {"compiled": backend.compiled, "hits": backend.hits,
            "frozen": (frozen.compiled, frozen.hits), "kept": len(backend.templates)}


def cache_row() -> str:
    c = cache_counts()
    agree = "agrees" if (c["compiled"], c["hits"]) == c["frozen"] else "differs"
    return (f"{c['compiled']} compiled, {c['hits']} copied, {c['kept']} kept; the frozen LRU "
            f"{agree}")


def masked_steps() -> str:
    o = overhead()
    return (f"{o['masked_steps']} of {TOKENS} steps masked; free rows unchanged: "
            f"{'yes' if o['free_rows_unchanged'] else 'no'}")


@functools.cache
def compile_costs() -> dict:
    from nanoserve.bench.structured import compile_costs as measure

    return measure(llm().core.grammars())


@functools.cache
def vocab_fill() -> dict:
    from nanoserve.bench.structured import vocab_costs

    return vocab_costs([BIG_VOCAB])[0]


@functools.cache
def apply_costs() -> dict:
    from nanoserve.bench.structured import apply_costs as measure

    return measure([BIG_VOCAB], ROWS, CONSTRAINED)[0]


def no_op() -> str | None:
    from nanoserve.cpu import csrc

    why = csrc.load()
    return f"needs nanoserve's C++ ops ({why})" if why else None


CLAIMS = [
    exact("300 seeded requests over 40 regex specs through a cache of 16 templates",
          cache_row),
    exact("8 rows x 64 tokens, 4 under the long JSON schema: steps the sampler masked, and "
          "the 4 free rows against the same rows with no grammar beside them", masked_steps),
    timed("decode time, 4 of 8 rows constrained / none constrained, nanoserve-tiny float32, "
          "64 tokens", lambda: overhead()["ratio"], fmt="{:.2f}x".format),
    timed("the mask's share of a step with 4 constrained rows (fill + apply)",
          lambda: overhead()["mask_share"], fmt="{:.1%}".format),
    timed("a request's matcher, compiled cold / copied from the cache, first mask included, "
          "median of 50 random schemas", lambda: compile_costs()["saved"],
          fmt="{:.0f}x".format),
    timed("one row's mask fill, 131,072-id byte-level vocabulary, median of 40 steps",
          lambda: vocab_fill()["fill_ms"] / 1e3, fmt=lambda s: f"{1e3 * s:.2f} ms"),
    timed("applying 4 rows' masks to (8, 131,072) logits, PyTorch unpack / C++ op",
          lambda: apply_costs()["op_speedup"], fmt="{:.1f}x".format, needs=no_op),
]
