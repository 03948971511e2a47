"""Day 50's numbers: what each decode read materialises, that the gathered read gives the
reference's logits and tokens, that the index is kept (not rebuilt) through a ragged life, and
what the read costs in time on this CPU.

Workspace rows price one layer's read with the frozen ``workspace_bytes`` at SmolLM2-135M's
attention shape (9 query heads, 3 KV heads, head size 64, bf16). The logit row runs the Day 1
model over Day 17's cache and over this day's frozen ``GatheredPagedKVCache``; the token row
runs the package's ``LLM`` with both reads; the life rows drive the package's and the frozen
``GatheredIndex`` through one scripted sequence of steps.
"""

from __future__ import annotations

import functools
import time

import torch

from chapters.common import SHIPPED, best_of, hf_checkpoint
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.day17_paged_kv_cache.snapshot.attention import paged_attention_batched_reference
from chapters.day17_paged_kv_cache.snapshot.paged import BatchedPagedKVCache
from chapters.day27_padded_prefill.snapshot.prefill import padded_prefill
from chapters.day28_batched_decode.snapshot.decode import batched_decode
from chapters.runner import bound, exact, timed

from .snapshot import attention as snap
from .snapshot.gathered import GatheredIndex
from .snapshot.paged import GatheredPagedKVCache

HEADS = (9, 3, 64)  # SmolLM2-135M: query heads, KV heads, head size
BATCHES = {"ragged": [2000] + [50] * 31, "spread": list(range(16, 208, 6)), "even": [512] * 32}
MIB = 2**20


# ---------------------------------------------------------------------------- workspace


def workspace(name: str) -> str:
    ref, got = (snap.workspace_bytes(p, BATCHES[name], *HEADS, 2) for p in snap.PATHS)
    return f"reference {ref / MIB:.2f} MiB, gathered {got / MIB:.2f} MiB"


def workspace_agrees() -> str:
    from nanoserve.attention.selector import workspace_bytes

    pairs = [(p, lens) for lens in BATCHES.values() for p in snap.PATHS]
    agree = sum(workspace_bytes(p, lens, *HEADS, 2) == snap.workspace_bytes(p, lens, *HEADS, 2)
                for p, lens in pairs)
    return f"{agree} of {len(pairs)} agree"


class CountingPool(torch.Tensor):
    """A key pool that records every cell a read gathers from it: the index tensor of each
    ``pool[index]`` or ``pool.index_select(0, index)`` call. The counts below are read from
    those calls, made by the frozen reads themselves, not from the context lengths."""

    calls: list[torch.Tensor] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and isinstance(args[1], torch.Tensor):
            cls.calls.append(args[1])
        elif func in (torch.Tensor.index_select, torch.index_select) and args[1] == 0:
            cls.calls.append(args[2])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


@torch.inference_mode()
def counted_cells(lens: list[int], C: int = 32) -> tuple[int, int, int]:
    """Cells each read gathers from the key pool, counted on the pool: the rectangle (Day 17's
    reference read), the chunks (the frozen gathered read), and of the chunks' cells those that
    hold a context position (the rest are padding the read masks)."""
    q, kp, vp, rect, cells, chunk_b = ragged_read(lens, C)
    ctx = torch.tensor(lens)
    pool = kp.as_subclass(CountingPool)
    CountingPool.calls = []
    paged_attention_batched_reference(q[:, :, None], pool, vp, rect, (ctx - 1)[:, None], ctx)
    rectangle = sum(i.numel() for i in CountingPool.calls)
    CountingPool.calls = []
    snap.paged_attention_gathered(q, pool, vp, cells, chunk_b)
    (flat,) = CountingPool.calls
    real = int((cells.view(-1) >= 0).sum())  # the chunk cells the read does not mask
    return rectangle, flat.numel(), real


def cells_read(lens: list[int] | None = None) -> str:
    rect, chunks, real = counted_cells(BATCHES["ragged"] if lens is None else lens)
    return f"{rect:,}; {chunks:,}; {real:,}"


# ---------------------------------------------------------------------------- logits, tokens

CONTEXTS, STEPS = [3, 70, 12, 37], 40


@torch.inference_mode()
def logit_difference() -> float:
    """Max |logit| difference between the gathered and the rectangle read, every decode step,
    4 ragged rows (contexts 3 to 110, crossing chunk boundaries), nanoserve-tiny and the five
    test checkpoints; the reference's greedy token is fed to both."""
    from nanoserve.testing import CONFIGS

    worst = 0.0
    for model in [load_model(SHIPPED)] + [load_model(hf_checkpoint(n)) for n in CONFIGS]:
        vocab = model.cfg.vocab_size
        g = torch.Generator().manual_seed(50)
        prompts = [torch.randint(2, vocab - 1, (n,), generator=g).tolist() for n in CONTEXTS]
        caches, rows = [], list(range(len(CONTEXTS)))
        for cls in (BatchedPagedKVCache, GatheredPagedKVCache):
            pool = BlockAllocator(512, 4)
            cache = cls.for_model(model, 512, 4, len(rows), 256)
            for r in rows:
                cache.tables[r].extend(pool.allocate(40))
            caches.append(cache)
        logits = [padded_prefill(model, c, rows, prompts) for c in caches]
        for _ in range(STEPS):
            toks = logits[0].argmax(-1).tolist()
            logits = [batched_decode(model, c, rows, toks) for c in caches]
            worst = max(worst, (logits[0] - logits[1]).abs().max().item())
    return worst


@functools.cache
def package_tokens() -> tuple[int, int, int]:
    """Greedy tokens from LLM(attention=...) both ways: 8 ragged prompts over 4 slots, a pool
    small enough to preempt (a preempted row is reset, so its index is invalidated)."""
    from nanoserve import LLM, SamplingParams

    g = torch.Generator().manual_seed(50)
    prompts = [torch.randint(2, 2000, (n,), generator=g).tolist()
               for n in (3, 40, 7, 90, 12, 5, 60, 20)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in (24, 8, 40, 16, 32, 4, 12, 28)]
    runs = {}
    for attention in ("reference", "gathered"):
        llm = LLM(SHIPPED, dtype="float32", max_num_seqs=4, block_size=4, num_kv_blocks=32,
                  max_model_len=160, skip_tokenizer_init=True, attention=attention)
        runs[attention] = ([o.token_ids for o in llm.generate(prompts, params)],
                           llm.stats.preemptions)
    (ref, pre_ref), (got, pre_got) = runs["reference"], runs["gathered"]
    bad = sum(a != b for a, b in zip(ref, got, strict=True))
    return bad, len(ref), min(pre_ref, pre_got)


def tokens() -> str:
    bad, n, pre = package_tokens()
    return f"{bad} of {n} requests differ, through {pre} preemptions"


def flag() -> str:
    import argparse

    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai.serve import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    (action,) = [a for a in p._actions if a.dest == "attention"]
    default = EngineConfig.default("attention")
    return f"{default}; {', '.join(action.choices)}; {action.default}"


# ---------------------------------------------------------------------------- a ragged life

ROWS, MAX_LEN = 6, 256


def _life(index_cls) -> dict:
    """Joins, 40 steady steps, a reset and a new row, a rejoin, rows leaving and coming back,
    a move (row 3 to row 5) and a held row, on a bare index over a random slot table."""
    g = torch.Generator().manual_seed(7)
    slots = torch.randperm(ROWS * MAX_LEN, generator=g).view(ROWS, MAX_LEN).clone()
    lengths = [0] * ROWS
    index = index_cls(ROWS)
    layouts, exact_steps = [], 0

    def join(r, n):
        lengths[r] = n  # its prefill wrote cells 0..n-1

    def steps(rows, n=1, hold=frozenset()):
        nonlocal exact_steps
        for _ in range(n):
            ctx = [lengths[r] + 1 for r in rows]
            new = torch.stack([slots[r, c - 1] for r, c in zip(rows, ctx, strict=True)])
            cells, chunk_b = index.update(rows, ctx, new, slots)
            layouts.append((cells.clone(), chunk_b.clone()))
            exact_steps += all(torch.equal(cells[chunk_b == b][cells[chunk_b == b] >= 0],
                                           slots[r, :c])
                               for b, (r, c) in enumerate(zip(rows, ctx, strict=True)))
            for r in rows:
                lengths[r] += r not in hold

    for r, n in zip(range(4), (37, 3, 70, 1), strict=True):
        join(r, n)
    steps([0, 1, 2, 3], 40)
    lengths[2] = 0  # reset: the row goes, the index forgets it
    slots[2] = torch.randperm(MAX_LEN, generator=g) + ROWS * MAX_LEN
    index.invalidate(2)
    join(4, 9)
    steps([0, 1, 3, 4], 5)
    reset_left = int((index.chunk_row[:index.n] == 2).sum())
    join(2, 2)
    steps([4, 2, 0, 1, 3], 3)  # another order: chunks name rows, not places
    steps([0, 1], 2)  # rows missing from a step are dropped, then rejoin
    steps([0, 1, 2, 3, 4], 2)
    slots[5], lengths[5], lengths[3] = slots[3], lengths[3], 0  # the move: 3 -> 5
    index.invalidate(3)
    index.invalidate(5)
    steps([0, 1, 2, 4, 5], 3)
    moved_left = int((index.chunk_row[:index.n] == 3).sum())
    steps([0, 1, 2], 3, hold=frozenset({1}))  # a held row rewrites its cell in place
    return dict(layouts=layouts, exact=exact_steps, rebuilt=index.rebuilt_rows,
                appended=index.appended_cells, stale=reset_left + moved_left)


@functools.cache
def life() -> dict:
    return _life(GatheredIndex)


def life_exact() -> str:
    r = life()
    return f"{r['exact']} of {len(r['layouts'])}"


def upkeep() -> str:
    r = life()
    return f"{r['rebuilt']} rows appended whole; {r['appended']} cells appended one at a time"


def package_agrees() -> str:
    from nanoserve.attention.backends.gathered import GatheredIndex as Live

    mine, live = life()["layouts"], _life(Live)["layouts"]
    same = sum(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(mine, live, strict=True))
    return f"{same} of {len(mine)} steps identical"


# ---------------------------------------------------------------------------- timed


def ragged_read(lens: list[int], C: int = 32, dtype=torch.float32):
    """One layer's decode inputs for a ragged batch over a scrambled pool: q, the pools, the
    (B, S) rectangle of cells, and the (n, C) chunk cells with each chunk's row."""
    Hq, Hkv, D = HEADS
    g = torch.Generator().manual_seed(0)
    N = sum(lens)
    kp, vp = (torch.randn(N, Hkv, D, generator=g).to(dtype) for _ in range(2))
    perm = torch.randperm(N, generator=g)
    rect = torch.full((len(lens), max(lens)), -1)
    chunks, owner, used = [], [], 0
    for b, n in enumerate(lens):
        rect[b, :n] = perm[used:used + n]
        for s in range(0, n, C):
            c = torch.full((C,), -1)
            piece = perm[used + s:used + min(n, s + C)]
            c[:len(piece)] = piece
            chunks.append(c)
            owner.append(b)
        used += n
    q = torch.randn(len(lens), Hq, D, generator=g).to(dtype)
    return q, kp, vp, rect, torch.stack(chunks), torch.tensor(owner)


@torch.inference_mode()
def read_speedup(rounds: int = 5, calls: int = 10) -> float:
    """Reference read time over gathered read time, the two interleaved (best_of)."""
    q, kp, vp, rect, cells, chunk_b = ragged_read(BATCHES["ragged"])
    ctx = torch.tensor(BATCHES["ragged"])

    def reference():
        t0 = time.perf_counter()
        for _ in range(calls):
            paged_attention_batched_reference(q[:, :, None], kp, vp, rect, (ctx - 1)[:, None],
                                              ctx)
        return time.perf_counter() - t0

    def gathered():
        t0 = time.perf_counter()
        for _ in range(calls):
            snap.paged_attention_gathered(q, kp, vp, cells, chunk_b)
        return time.perf_counter() - t0

    best = best_of(rounds, {"reference": reference, "gathered": gathered}, lambda s: s)
    return best["reference"] / best["gathered"]


SHAPE = "SmolLM2-135M heads 9/3, D=64, bf16"
CLAIMS = [
    exact(f"one layer's decode read workspace, one of 2000 + 31 of 50 tokens ({SHAPE})",
          lambda: workspace("ragged")),
    exact(f"the same, 32 rows of 16..202 tokens ({SHAPE})", lambda: workspace("spread")),
    exact(f"the same, 32 rows of 512 tokens ({SHAPE})", lambda: workspace("even")),
    exact("the package's `workspace_bytes` against the snapshot's, 3 batches x 2 paths",
          workspace_agrees),
    exact("context cells one layer's read gathers, one of 2000 + 31 of 50: rectangle, chunks "
          "(C = 32), real", cells_read),
    exact("the same, the figure's four rows of 3, 70, 12 and 37 tokens",
          lambda: cells_read(CONTEXTS)),
    bound("max absolute logit difference, gathered vs reference read (snapshot over Day 17's "
          "cache; nanoserve-tiny and the five test checkpoints, float32, 4 ragged rows, "
          "40 decode steps)", logit_difference, fmt="{:.1e}".format),
    exact("greedy tokens, `attention=\"gathered\"` against `\"reference\"` (nanoserve-tiny, "
          "float32, 8 ragged requests over 4 slots, a cramped pool)", tokens),
    exact("`LLM(attention=...)` default; `nanoserve serve --attention` choices; its default",
          flag),
    exact("a scripted life of 6 rows, 58 decode steps (joins, a reset, leaving and rejoining, "
          "a move, a held row): steps where every row's chunks hold exactly its positions "
          "0..ctx-1", life_exact),
    exact("index upkeep over that life", upkeep),
    exact("chunks of the reset row and of the moved row's old place, one step later",
          lambda: life()["stale"]),
    exact("the package's `GatheredIndex` against the snapshot's through the same life",
          package_agrees),
    timed("decode read time, reference / gathered, one of 2000 + 31 of 50 tokens (one layer, "
          "9/3 heads, D=64, float32; 2-core x86 CPU, no GPU, one thread)", read_speedup,
          fmt="{:.1f}x".format),
]
