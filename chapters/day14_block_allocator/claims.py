"""Day 14's numbers: what a contiguous cache reserves against what paging holds."""

from __future__ import annotations

import random

import torch

from chapters.common import LLAMA_3_2_1B, meta_model
from chapters.day07_kv_cache.snapshot.kv_cache import KVCache
from chapters.runner import exact

from .snapshot.block_allocator import BlockAllocator

# A ragged batch: eight sequences under max_model_len 1024, block_size 16.
LENGTHS = [37, 512, 9, 130, 1000, 64, 250, 5]
MAX_MODEL_LEN, BLOCK_SIZE = 1024, 16


def paged_blocks() -> list[list[int]]:
    """Allocate each sequence exactly the blocks its tokens occupy."""
    pool = BlockAllocator(num_blocks=len(LENGTHS) * MAX_MODEL_LEN // BLOCK_SIZE,
                          block_size=BLOCK_SIZE)
    held = [pool.allocate(pool.blocks_for_length(n)) for n in LENGTHS]
    pool.check_invariants()
    return held


def contiguous_cache(batch: int = len(LENGTHS), max_len: int = MAX_MODEL_LEN) -> KVCache:
    """Day 7's contiguous cache for the batch, Llama-3.2-1B shape in bf16, on the meta device:
    the tensors it would allocate, with no memory behind them."""
    return KVCache.for_model(meta_model(LLAMA_3_2_1B, torch.bfloat16), batch, max_len)


def contiguous_slots() -> int:
    """Token positions the contiguous cache's K tensor (L, B, Hkv, Tmax, D) has room for."""
    k = contiguous_cache().k
    return k.shape[1] * k.shape[3]


def kv_bytes_per_token() -> int:
    """K and V bytes one position costs, read from a one-position contiguous cache."""
    return contiguous_cache(1, 1).nbytes()


def paged_slots() -> int:
    return sum(len(b) for b in paged_blocks()) * BLOCK_SIZE


def unused_positions() -> list[int]:
    """Per sequence: positions of its blocks that its tokens do not fill."""
    return [len(b) * BLOCK_SIZE - n for b, n in zip(paged_blocks(), LENGTHS, strict=True)]


def worst_tail_waste() -> int:
    return max(unused_positions())


def worst_tail_sequence() -> str:
    """The sequence that leaves the largest tail: its tokens, its blocks, their positions."""
    blocks = paged_blocks()
    i = max(range(len(LENGTHS)), key=lambda j: unused_positions()[j])
    n = len(blocks[i])
    return f"{LENGTHS[i]} tokens in {n} blocks, {n * BLOCK_SIZE} positions"


def sizing() -> str:
    """``blocks_for_length`` at block_size 16 for 37, 64 and 65 tokens, and each last block's
    unused tail."""
    pool = BlockAllocator(num_blocks=1, block_size=BLOCK_SIZE)
    need = [pool.blocks_for_length(n) for n in (37, 64, 65)]
    tails = [b * BLOCK_SIZE - n for b, n in zip(need, (37, 64, 65), strict=True)]
    return f"{', '.join(map(str, need))} blocks; tails {', '.join(map(str, tails))}"


def figure_history() -> str:
    """The figure's history on a 12-block pool: A takes 3, B 4, C 2; B finishes; D takes 5;
    A grows by 1. What D and A's growth are handed."""
    pool = BlockAllocator(num_blocks=12, block_size=BLOCK_SIZE)
    pool.allocate(3)
    b = pool.allocate(4)
    pool.allocate(2)
    pool.free(b)
    d = pool.allocate(5)
    a = pool.allocate(1)
    pool.check_invariants()
    return f"D gets {', '.join(map(str, d))}; A grows into {', '.join(map(str, a))}"


def fragmentation_bound() -> str:
    """Over 20,000 random lengths and block sizes 1..64, the unused tail of the last block is
    never more than block_size - 1, and reaches it."""
    rng = random.Random(14)
    reached = True
    for bs in range(1, 65):
        pool = BlockAllocator(num_blocks=1, block_size=bs)
        tails = [pool.blocks_for_length(n) * bs - n for n in
                 (rng.randint(1, 8192) for _ in range(20_000 // 64))]
        tails.append(pool.blocks_for_length(bs + 1) * bs - (bs + 1))  # one past a boundary
        if max(tails) > bs - 1:
            return f"exceeded at block_size {bs}"
        reached &= max(tails) == bs - 1
    return "≤ block_size − 1" if reached else "bound never reached"


def random_ops_violations(ops: int = 5000) -> int:
    """Random allocate/free, invariants checked after each; counts broken checks."""
    rng = random.Random(1)
    pool, held, broken = BlockAllocator(64, 16), [], 0
    for _ in range(ops):
        if rng.random() < 0.55:
            n = rng.randint(0, 8)
            if pool.can_allocate(n):
                held.append(pool.allocate(n))
        elif held:
            pool.free(held.pop(rng.randrange(len(held))))
        try:
            pool.check_invariants()
        except AssertionError:
            broken += 1
    return broken


CLAIMS = [
    exact("token slots a contiguous max-length cache reserves (8 seqs x 1,024)",
          contiguous_slots, fmt="{:,}".format),
    exact("token slots paging holds (block_size 16)", paged_slots, fmt="{:,}".format),
    exact("positions paging leaves unused, all eight last blocks",
          lambda: sum(unused_positions())),
    exact("blocks paging allocates", lambda: sum(len(b) for b in paged_blocks())),
    exact("share of the contiguous reservation that paging needs (ratio)",
          lambda: paged_slots() / contiguous_slots(), fmt="{:.1%}".format),
    exact("Llama-3.2-1B KV (bf16): contiguous reservation",
          lambda: contiguous_cache().nbytes() / 2**20, fmt="{:.0f} MiB".format),
    exact("Llama-3.2-1B KV (bf16): paged (slots held x KV bytes per slot)",
          lambda: paged_slots() * kv_bytes_per_token() / 2**20, fmt="{:.1f} MiB".format),
    exact("largest unused tail in this batch (tokens)", worst_tail_waste),
    exact("the sequence that leaves it", worst_tail_sequence),
    exact("block_size 16: blocks for 37, 64 and 65 tokens; the tails they leave", sizing),
    exact("the figure's 12-block pool: A takes 3, B 4, C 2; B frees; D takes 5; A grows by 1",
          figure_history),
    exact("fragmentation per sequence, any length, block sizes 1-64", fragmentation_bound),
    exact("invariant violations over 5,000 random allocate/free operations",
          random_ops_violations),
]
