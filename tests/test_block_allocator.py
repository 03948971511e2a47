"""BlockAllocator: atomic allocation, refused double frees, and no block ever lost or duplicated
under random allocate/free sequences (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.engine.block_allocator import BlockAllocator


def test_blocks_for_length():
    a = BlockAllocator(8, 4)
    assert [a.blocks_for_length(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError):
        a.blocks_for_length(-1)


def test_allocate_is_atomic():
    a = BlockAllocator(4, 16)
    held = a.allocate(3)
    with pytest.raises(ValueError, match="asked for 2 blocks, 1 of 4 are free"):
        a.allocate(2)
    assert a.num_free == 1  # nothing was taken by the failed call
    a.free(held)
    a.check_invariants()
    assert a.num_free == 4


def test_free_refuses_double_free_and_foreign_ids():
    a = BlockAllocator(4, 16)
    blocks = a.allocate(2)
    a.free([blocks[0]])
    with pytest.raises(ValueError, match=f"double free of block {blocks[0]}"):
        a.free([blocks[0]])
    with pytest.raises(ValueError, match="double free"):
        a.free([blocks[1], blocks[1]])
    with pytest.raises(ValueError, match="does not belong"):
        a.free([4])
    with pytest.raises(ValueError, match="does not belong"):
        a.free([-1])
    a.check_invariants()
    assert a.num_free == 3  # the refused calls released nothing


def test_lowest_free_id_first():
    a = BlockAllocator(6, 1)
    x = a.allocate(4)
    a.free([x[2], x[0]])
    assert a.allocate(2) == [0, 2]


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 32),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=60))
def test_random_sequences_never_lose_or_duplicate(num_blocks, ops):
    a = BlockAllocator(num_blocks, 4)
    held: list[list[int]] = []
    for is_alloc, k in ops:
        if is_alloc:
            n = k % (num_blocks + 2)
            if a.can_allocate(n):
                held.append(a.allocate(n))
            else:
                with pytest.raises(ValueError):
                    a.allocate(n)
        elif held:
            a.free(held.pop(k % len(held)))
        a.check_invariants()
        flat = [b for h in held for b in h]
        assert len(flat) == len(set(flat)) == a.num_held
    for h in held:
        a.free(h)
    a.check_invariants()
    assert a.num_free == num_blocks
