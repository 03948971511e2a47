# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Day 14 notebook: a block allocator, driven by hand
#
# No model and no tensors today: the allocator is pure bookkeeping over block ids. On a CPU, in
# a second or two:
#
# 1. sizing: how many blocks a sequence of `n` tokens needs, and the tail it leaves unused;
# 2. allocate and free on a small pool, lowest id first, with the invariants checked each time;
# 3. every refusal, caught and printed: an allocation the pool cannot cover, a double free, a
#    foreign id, a duplicate inside one call, and proof that a refused call changed nothing;
# 4. how a sequence's blocks stop being adjacent once other sequences come and go;
# 5. the chapter's ragged batch, contiguous against paged, from the allocator's own answers;
# 6. a few thousand random operations with `check_invariants` after each.

# %%
import pathlib
import random
import sys

ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt

from nanoserve.engine.block_allocator import BlockAllocator

# %% [markdown]
# ## 1. Sizing: ceil(n / block_size), and the tail
#
# A sequence of `n` tokens needs `ceil(n / block_size)` blocks. The positions it holds but does
# not use are the tail of its last block: 0 when `n` is a multiple of the block size, and
# `block_size - 1` just after one.

# %%
pool = BlockAllocator(num_blocks=8, block_size=16)
for n in (0, 1, 15, 16, 17, 37, 64, 65):
    blocks = pool.blocks_for_length(n)
    held_slots = blocks * pool.block_size
    print(f"{n:3d} tokens -> {blocks} blocks = {held_slots:3d} positions, tail {held_slots - n:2d}")

# %% [markdown]
# ## 2. Allocate and free
#
# The pool hands out the lowest free ids first. `num_free` and `num_held` always add up to
# `num_blocks`, and `check_invariants()` (which raises `AssertionError` if the bookkeeping is
# broken) passes after every step.

# %%
def show(label: str) -> None:
    pool.check_invariants()
    print(f"{label:38s} free {pool.num_free}, held {pool.num_held}  (invariants hold)")


a = pool.allocate(3)
show(f"a = allocate(3) -> {a}")
b = pool.allocate(2)
show(f"b = allocate(2) -> {b}")
pool.free(a)
show(f"free({a})")
c = pool.allocate(4)
show(f"c = allocate(4) -> {c}")

# %% [markdown]
# `c` got blocks 0, 1, 2 (the ones `a` gave back, lowest first) and then 5: the sequence's
# blocks are not adjacent, and they do not need to be. A list of the sequence's blocks, in
# order, is enough to map a token position to its block and offset, wherever that block sits in
# the pool.

# %% [markdown]
# ## 3. Every refusal
#
# Each of these raises a `ValueError` that says what was wrong. None of them changes the pool:
# the free count is the same before and after.

# %%
def attempt(label: str, call) -> None:
    before = pool.num_free
    try:
        call()
        print(f"{label:28s} accepted (!)")
    except ValueError as e:
        print(f"{label:28s} ValueError: {e}")
    pool.check_invariants()
    assert pool.num_free == before, "a refused call changed the pool"


print(f"pool: {pool.num_blocks} blocks, {pool.num_free} free; b = {b}, c = {c}\n")
attempt("allocate(5)", lambda: pool.allocate(5))
attempt("allocate(-1)", lambda: pool.allocate(-1))
attempt("free([7]), a free block", lambda: pool.free([7]))  # 7 was never handed out
attempt(f"free({b} + [{b[0]}])", lambda: pool.free(b + [b[0]]))
attempt("free([8])", lambda: pool.free([8]))
attempt("free([-1])", lambda: pool.free([-1]))
attempt(f"free([{c[0]}, 7])", lambda: pool.free([c[0], 7]))
print(f"\nafter all that: {pool.num_free} free, and b and c still hold {b} and {c}")

# %% [markdown]
# The last case is the one that justifies two passes in `free`. Block `c[0]` is held and could
# be freed, but block 7 is already free, so the whole call is refused and `c[0]` stays held.
# Had `free` released ids as it checked them, the error would have been raised after `c[0]` was
# already back on the free list, while its owner, seeing the error, would think it still held
# it.
#
# A freed block freed again is the classic one:

# %%
pool.free(b)
show(f"free({b})")
attempt(f"free({b}) again", lambda: pool.free(b))
pool.free(c)
show(f"free({c})")

# %% [markdown]
# ## 4. Sequences that come and go
#
# A short history on a 12-block pool (the chapter's second figure). Print who holds which
# block after each operation: once B finishes, D and then A fill the gap and run past it, and
# neither holds a contiguous range any more.

# %%
pool = BlockAllocator(num_blocks=12, block_size=16)
held: dict[str, list[int]] = {}


def picture() -> str:
    owner = {blk: name for name, blks in held.items() for blk in blks}
    return " ".join(owner.get(i, ".") for i in range(pool.num_blocks))


for name, n in [("A", 3), ("B", 4), ("C", 2), ("B", 0), ("D", 5), ("A", 1)]:
    if n == 0:
        pool.free(held.pop(name))
        label = f"{name} finishes"
    else:
        got = pool.allocate(n)
        held.setdefault(name, []).extend(got)
        label = f"{name}: allocate({n}) -> {got}"
    pool.check_invariants()
    print(f"{picture()}   {label}")
print("\n".join(f"  {name} holds {blks}" for name, blks in sorted(held.items())))

# %% [markdown]
# ## 5. The ragged batch, contiguous against paged
#
# The chapter's claims use eight sequences under `max_model_len` 1,024, block size 16. A
# contiguous cache reserves 1,024 positions for each; the allocator gives each one
# `blocks_for_length(n)` blocks. For bytes, take the Llama-3.2-1B shape in bf16: K and V, 16
# layers, 8 KV heads, head_dim 64, 2 bytes each.

# %%
LENGTHS = [37, 512, 9, 130, 1000, 64, 250, 5]
MAX_MODEL_LEN, BS = 1024, 16
KV_BYTES_PER_TOKEN = 2 * 16 * 8 * 64 * 2

pool = BlockAllocator(num_blocks=len(LENGTHS) * MAX_MODEL_LEN // BS, block_size=BS)
tables = [pool.allocate(pool.blocks_for_length(n)) for n in LENGTHS]
pool.check_invariants()

print(f"{'seq':>3} {'tokens':>6} {'blocks':>6} {'tail':>4}  first block ids")
for i, (n, t) in enumerate(zip(LENGTHS, tables, strict=True)):
    more = " ..." if len(t) > 4 else ""
    print(f"{i:3d} {n:6d} {len(t):6d} {len(t) * BS - n:4d}  {t[:4]}{more}")

contiguous = len(LENGTHS) * MAX_MODEL_LEN
paged = pool.num_held * BS
print(f"\ntokens held:        {sum(LENGTHS):,}")
print(f"contiguous reserve: {contiguous:,} positions = "
      f"{contiguous * KV_BYTES_PER_TOKEN / 2**20:.0f} MiB")
print(f"paged:              {pool.num_held} blocks = {paged:,} positions = "
      f"{paged * KV_BYTES_PER_TOKEN / 2**20:.1f} MiB ({paged / contiguous:.1%} of the reserve)")
print(f"largest tail:       {max(len(t) * BS - n for n, t in zip(LENGTHS, tables, strict=True))}"
      f" tokens (bound: block_size - 1 = {BS - 1})")
print(f"still free:         {pool.num_free} of {pool.num_blocks} blocks")

# %% [markdown]
# How the unused positions depend on the block size, for this batch: the tails grow with the
# block size, but stay far below the contiguous reservation's 6,185 unused positions at every
# size a real engine would pick.

# %%
sizes = [1, 2, 4, 8, 16, 32, 64, 128]
unused = []
for bs in sizes:
    p = BlockAllocator(num_blocks=1, block_size=bs)
    unused.append(sum(p.blocks_for_length(n) * bs - n for n in LENGTHS))
for bs, u in zip(sizes, unused, strict=True):
    print(f"block_size {bs:3d}: {u:4d} unused positions")

fig, ax = plt.subplots(figsize=(7.5, 3.2))
ax.plot(sizes, unused, "o-", color="#d1495b", label="paged: unused tails")
ax.axhline(contiguous - sum(LENGTHS), color="#7a7a7a", ls="--",
           label=f"contiguous: {contiguous - sum(LENGTHS):,} unused")
ax.set_xscale("log", base=2)
ax.set_xticks(sizes)
ax.set_xticklabels([str(s) for s in sizes])
ax.set_xlabel("block_size (tokens)")
ax.set_ylabel("unused positions")
ax.set_ylim(0, (contiguous - sum(LENGTHS)) * 1.1)
ax.set_title("The ragged batch: what paging leaves unused, by block size")
ax.legend(frameon=False)
fig.tight_layout()

# %% [markdown]
# ## 6. Random operations, invariants after each
#
# The same test the claims run (and, in smaller pieces, the hypothesis test in
# `tests/test_block_allocator.py`): random allocations of 0 to 8 blocks and random frees of a
# held list, on a 64-block pool, with `check_invariants` after every operation. An allocation
# the pool cannot cover is refused and counted.

# %%
rng = random.Random(1)
pool, held_lists = BlockAllocator(64, 16), []
refused = broken = 0
for _ in range(5000):
    if rng.random() < 0.55:
        n = rng.randint(0, 8)
        try:
            held_lists.append(pool.allocate(n))
        except ValueError:
            refused += 1
    elif held_lists:
        pool.free(held_lists.pop(rng.randrange(len(held_lists))))
    try:
        pool.check_invariants()
    except AssertionError:
        broken += 1
flat = [blk for h in held_lists for blk in h]
print(f"5,000 operations: {refused} allocations refused, {broken} invariant violations")
print(f"at the end: {pool.num_held} held in {len(held_lists)} lists, "
      f"no id twice: {len(flat) == len(set(flat)) == pool.num_held}")
