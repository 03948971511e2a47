"""Day 14's numbers: what a contiguous cache reserves against what paging holds."""

from __future__ import annotations

import random

from chapters.common import LLAMA_3_2_1B
from chapters.runner import exact

from .snapshot.block_allocator import BlockAllocator

# A ragged batch: eight sequences under max_model_len 1024, block_size 16.
LENGTHS = [37, 512, 9, 130, 1000, 64, 250, 5]
MAX_MODEL_LEN, BLOCK_SIZE = 1024, 16
KV_BYTES_PER_TOKEN = 2 * LLAMA_3_2_1B["num_hidden_layers"] * LLAMA_3_2_1B["num_key_value_heads"] \
    * LLAMA_3_2_1B["head_dim"] * 2  # K and V, bf16


def paged_blocks() -> list[list[int]]:
    """Allocate each sequence exactly the blocks its tokens occupy."""
    pool = BlockAllocator(num_blocks=len(LENGTHS) * MAX_MODEL_LEN // BLOCK_SIZE,
                          block_size=BLOCK_SIZE)
    held = [pool.allocate(pool.blocks_for_length(n)) for n in LENGTHS]
    pool.check_invariants()
    return held


def contiguous_slots() -> int:
    return len(LENGTHS) * MAX_MODEL_LEN


def paged_slots() -> int:
    return sum(len(b) for b in paged_blocks()) * BLOCK_SIZE


def worst_tail_waste() -> int:
    return max(len(b) * BLOCK_SIZE - n for b, n in zip(paged_blocks(), LENGTHS, strict=True))


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
    exact("token slots a contiguous max-length cache reserves (8 seqs x 1,024)", "8,192",
          contiguous_slots, fmt="{:,}".format),
    exact("tokens the ragged batch actually holds", "2,007", lambda: sum(LENGTHS),
          fmt="{:,}".format),
    exact("token slots paging holds (block_size 16)", "2,064", paged_slots, fmt="{:,}".format),
    exact("blocks paging allocates", "129", lambda: sum(len(b) for b in paged_blocks())),
    exact("share of the contiguous reservation that paging needs", "25.2%",
          lambda: paged_slots() / contiguous_slots(), fmt="{:.1%}".format),
    exact("Llama-3.2-1B KV (bf16): contiguous reservation", "256 MiB",
          lambda: contiguous_slots() * KV_BYTES_PER_TOKEN / 2**20, fmt="{:.0f} MiB".format),
    exact("Llama-3.2-1B KV (bf16): paged", "64.5 MiB",
          lambda: paged_slots() * KV_BYTES_PER_TOKEN / 2**20, fmt="{:.1f} MiB".format),
    exact("largest unused tail in this batch (tokens)", "14", worst_tail_waste),
    exact("fragmentation per sequence, any length, block sizes 1-64", "≤ block_size − 1",
          fragmentation_bound),
    exact("invariant violations over 5,000 random allocate/free operations", "0",
          random_ops_violations),
]
