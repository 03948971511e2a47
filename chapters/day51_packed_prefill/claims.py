"""Day 51's numbers: what packing a batch of prompts saves, counted, and that it changes nothing.

Positions come from the package's own counters (``LLM.stats``) with each prefill policy; the
stream, the attention score counts and the logit checks run the frozen snapshot (Day 51's packed
prefill beside Day 27's padded one); the tokens run the package. Float32 on one thread.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from chapters.common import SHIPPED, ForwardCounter, best_of, hf_checkpoint, one_thread
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
from chapters.runner import bound, exact, timed

from .snapshot.packed import packed_prefill

LENGTHS = [5, 12, 40, 3, 90, 17, 8, 60]  # the ragged batch of the bench
# Text in the shipped model's domain (Python's documentation); the prompts are slices of it.
TEXT = ("A generator function returns an iterator that yields one value each time its body "
        "reaches a yield expression, and the local state of the function is kept between calls. "
        "When the body returns, the iterator raises StopIteration, which ends a for loop that "
        "is consuming it. A class defines its own iteration by implementing the __iter__ "
        "method, which must return an object with a __next__ method; the built-in function "
        "iter calls the first and next calls the second.")


@functools.cache
def prompts() -> tuple[tuple[int, ...], ...]:
    from nanoserve.tokenizer import Tokenizer

    words = Tokenizer.from_dir(SHIPPED).encode(TEXT, add_special_tokens=False)
    out = tuple(tuple(words[2 * i:2 * i + n]) for i, n in enumerate(LENGTHS))
    if [len(p) for p in out] != LENGTHS:
        raise ValueError(f"TEXT is too short for prompts of {LENGTHS} tokens")
    return out


def _plist() -> list[list[int]]:
    return [list(p) for p in prompts()]


# ---------------------------------------------------------------- the package's counters


@functools.cache
def llm_run(policy: str, max_tokens: int) -> tuple[dict, list[list[int]]]:
    from nanoserve import LLM, SamplingParams

    with one_thread():
        llm = LLM(SHIPPED, dtype="float32", prefill=policy, max_num_seqs=8, max_model_len=256)
        outs = llm.generate(_plist(), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                     ignore_eos=True))
    s = llm.stats
    return ({"positions": s.positions_computed, "tokens": s.tokens_computed,
             "forwards": s.forward_passes}, [o.token_ids for o in outs])


def positions() -> str:
    return f"{llm_run('packed', 1)[0]['positions']} vs {llm_run('padded', 1)[0]['positions']}"


def tokens_and_forwards() -> str:
    return "; ".join(f"{c['tokens']} in {c['forwards']}"
                     for c, _ in (llm_run("packed", 1), llm_run("padded", 1)))


def padding_share() -> str:
    """Padding positions of the padded batch, from its counters: positions run minus tokens."""
    padded = llm_run("padded", 1)[0]
    pad = padded["positions"] - padded["tokens"]
    return f"{pad} of {padded['positions']} ({pad / padded['positions']:.1%})"


def tokens_identical() -> str:
    a, b = llm_run("packed", 32)[1], llm_run("padded", 32)[1]
    same = sum(x == y and len(x) == 32 for x, y in zip(a, b, strict=True))
    return f"{same} of {len(a)} requests identical"


def package_logits(policy: str) -> torch.Tensor:
    from nanoserve.engine.engine import Engine
    from nanoserve.model.weights import load_model as live_load

    e = Engine(live_load(SHIPPED, "float32"), 64, 16, 8, 256, prefill=policy)
    for row, n in enumerate(LENGTHS):
        e.grant(row, n)
    with torch.inference_mode(), one_thread():
        return e.prefill(list(range(8)), _plist())


def worst(a: torch.Tensor, b: torch.Tensor) -> float:
    from nanoserve.testing import relative_logit_error

    return max(relative_logit_error(x, y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- the snapshot


def fresh_cache(model, lengths, extra: int = 0) -> BatchedPagedKVCache:
    pool = BlockAllocator(128, 4)
    cache = BatchedPagedKVCache.for_model(model, 128, 4, len(lengths), 256)
    for row, n in enumerate(lengths):
        cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n + extra)))
    return cache


@functools.cache
def tiny():
    return load_model(SHIPPED)


@functools.cache
def snapshot_logits(how: str) -> torch.Tensor:
    model, rows = tiny(), list(range(len(LENGTHS)))
    cache = fresh_cache(model, LENGTHS)
    if how == "padded":
        return padded_prefill(model, cache, rows, _plist())
    return packed_prefill(model, cache, rows, _plist(), mask=how == "mask")


def stream() -> str:
    model = tiny()
    with ForwardCounter(model) as fc:
        packed_prefill(model, fresh_cache(model, LENGTHS), list(range(8)), _plist())
    return f"{fc.shapes[0]}, {fc.calls} forward"


class ScoreCounter(TorchFunctionMode):
    """Counts attention scores: B x T x S of every scaled_dot_product_attention call."""

    def __init__(self):
        super().__init__()
        self.scores = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            self.scores += q.shape[0] * q.shape[-2] * k.shape[-2]
        return func(*args, **(kwargs or {}))


def scores() -> str:
    model, counts = tiny(), []
    for how in ("loop", "mask", "padded"):
        cache, rows = fresh_cache(model, LENGTHS), list(range(8))
        with ScoreCounter() as sc:
            if how == "padded":
                padded_prefill(model, cache, rows, _plist())
            else:
                packed_prefill(model, cache, rows, _plist(), mask=how == "mask")
        counts.append(sc.scores // model.cfg.num_hidden_layers)
    return "; ".join(f"{c:,}" for c in counts)


@torch.inference_mode()
def against_alone(continuation: bool) -> float:
    """The snapshot's packed prefill on the five transformers-written checkpoints, each row
    held against a plain forward of its sequence alone. ``continuation``: the rows first take
    a padded prefill of other lengths, so the packed step's positions start mid-sequence."""
    from nanoserve.testing import CONFIGS, relative_logit_error

    g = torch.Generator().manual_seed(51)
    lens, first = [5, 17, 1, 9], [3, 1, 8, 2]
    tail = [torch.randint(1, 255, (n,), generator=g).tolist() for n in lens]
    head = [torch.randint(1, 255, (n,), generator=g).tolist() for n in first]
    worst_seen = 0.0
    for name in CONFIGS:
        model = load_model(hf_checkpoint(name))
        rows = [2, 0, 3, 1]  # batch row and cache row differ on purpose
        cache = fresh_cache(model, [0] * 4, extra=32)
        if continuation:
            padded_prefill(model, cache, rows, head)
        got = packed_prefill(model, cache, rows, tail)
        for b in range(4):
            seq = (head[b] if continuation else []) + tail[b]
            alone = model.compute_logits(model(torch.tensor([seq]), torch.arange(len(seq))[None]))
            worst_seen = max(worst_seen, relative_logit_error(got[b], alone[0, -1]))
    return worst_seen


@torch.inference_mode()
def prefill_speedup(rounds: int = 5) -> float:
    """Day 27's padded prefill against the packed one, same model and prompts, interleaved."""
    model, rows = tiny(), list(range(len(LENGTHS)))

    def arm(fn):
        def once() -> float:
            cache = fresh_cache(model, LENGTHS)
            t = time.perf_counter()
            fn(model, cache, rows, _plist())
            return time.perf_counter() - t
        return once

    best = best_of(rounds, {"packed": arm(packed_prefill), "padded": arm(padded_prefill)},
                   lambda s: s)
    return best["padded"] / best["packed"]


TINY = "nanoserve-tiny float32, the 8 prompts"
CLAIMS = [
    exact(f"{TINY}: positions computed (`LLM.stats`), packed vs padded", positions),
    exact(f"{TINY}: real tokens computed, in how many forwards (packed; padded)",
          tokens_and_forwards),
    exact(f"{TINY}: positions of the padded batch that are padding", padding_share),
    exact(f"{TINY}, snapshot: the packed forward's input shape, forwards", stream),
    exact(f"{TINY}, snapshots: attention scores per layer and query head (per-prompt loop; "
          "one block-diagonal mask; Day 27's padded rectangle)", scores),
    bound("five transformers-written checkpoints, float32, 4 prompts: snapshot packed prefill "
          "vs each prompt alone, max relative logit difference",
          lambda: against_alone(False), fmt="{:.2e}".format),
    bound("the same, a packed step onto rows already holding tokens vs each sequence alone",
          lambda: against_alone(True), fmt="{:.2e}".format),
    bound(f"{TINY}, snapshot: per-prompt loop vs one block-diagonal mask, max relative logit "
          "difference", lambda: worst(snapshot_logits("loop"), snapshot_logits("mask")),
          fmt="{:.2e}".format),
    bound(f"{TINY}: package `Engine(prefill=\"packed\")` vs the snapshot, max relative logit "
          "difference", lambda: worst(package_logits("packed"), snapshot_logits("loop")),
          fmt="{:.2e}".format),
    bound(f"{TINY}: package, first-token logits, packed vs padded, max relative difference",
          lambda: worst(package_logits("packed"), package_logits("padded")),
          fmt="{:.2e}".format),
    exact(f"{TINY}: package, greedy tokens packed vs padded, 32 per request", tokens_identical),
    timed(f"2-core x86 CPU, no GPU, one thread; {TINY}: prefill wall time, padded / packed "
          "(snapshots, best of 5 interleaved rounds)", prefill_speedup, fmt="{:.2f}x".format),
]
