"""The paged cache against the simple paths it replaces: contiguous cache, per-prompt prefill,
one-at-a-time decode. Plus every refusal of the block and slot tables."""

from __future__ import annotations

import pytest
import torch

from nanoserve.attention.kv_cache import KVCache
from nanoserve.attention.paged import BatchedPagedKVCache, BlockTable
from nanoserve.engine.block_allocator import BlockAllocator
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error


@pytest.fixture(scope="module")
def model(hf_checkpoint):
    return load_model(hf_checkpoint("llama3_rope"), "float32")


def _paged(model, rows=4, num_blocks=64, block_size=4, max_len=128):
    pool = BlockAllocator(num_blocks, block_size)
    return pool, BatchedPagedKVCache.for_model(model, num_blocks, block_size, rows, max_len)


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 255, (n,), generator=g).tolist() for n in lengths]


def _forward(model, cache, rows, token_lists, hold=frozenset()):
    lens = [len(t) for t in token_lists]
    B, T = len(rows), max(lens)
    ids, pos = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    for b, (row, toks) in enumerate(zip(rows, token_lists, strict=True)):
        ids[b, :len(toks)] = torch.tensor(toks)
        pos[b, :len(toks)] = torch.arange(cache.lengths[row], cache.lengths[row] + len(toks))
    cache.begin_step(rows, lens, hold)
    with torch.no_grad():
        h = model(ids, pos, cache)
    cache.end_step()
    return model.compute_logits(h)  # (B, T, V)


def test_block_table_refuses_growth_past_capacity():
    t = BlockTable(block_size=4, capacity=2)
    t.extend([5, 9])
    assert t.cells(0, 8) == [20, 21, 22, 23, 36, 37, 38, 39]
    with pytest.raises(ValueError, match="at most 2 blocks"):
        t.append(1)
    with pytest.raises(ValueError, match="table has 2"):
        t.cells(7, 9)


def test_paged_equals_contiguous(model):
    """Same prompt, prefill + 6 decode steps, through both caches: logits within 1e-5."""
    prompt = _prompts([13])[0]
    pool, paged = _paged(model)
    paged.tables[2].extend(pool.allocate(pool.blocks_for_length(20)))
    contiguous = KVCache.for_model(model, 1, 20)
    toks = list(prompt)
    with torch.no_grad():
        a = _forward(model, paged, [2], [toks])[0, -1]
        b = model.compute_logits(model(torch.tensor([toks]), torch.arange(13)[None],
                                       contiguous))[0, -1]
        contiguous.advance(13)
        assert relative_logit_error(a, b) < 1e-5
        for step in range(6):
            t = int(b.argmax())
            a = _forward(model, paged, [2], [[t]])[0, -1]
            b = model.compute_logits(model(torch.tensor([[t]]), torch.tensor([[13 + step]]),
                                           contiguous))[0, -1]
            contiguous.advance(1)
            assert relative_logit_error(a, b) < 1e-5


def test_padded_prefill_equals_per_prompt_prefill(model):
    lengths = [5, 17, 1, 9]
    prompts = _prompts(lengths, seed=1)
    pool, cache = _paged(model)
    rows = [3, 0, 1, 2]  # rows need not be in order
    for row, n in zip(rows, lengths, strict=True):
        cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n)))
    batched = _forward(model, cache, rows, prompts)  # (4, 17, V)
    for b, p in enumerate(prompts):
        with torch.no_grad():
            alone = model.compute_logits(model(torch.tensor([p]), torch.arange(len(p))[None]))
        assert relative_logit_error(batched[b, :len(p)], alone[0]) < 1e-5
    assert cache.lengths == [17, 1, 9, 5]


def test_batched_decode_equals_decoding_each_alone(model):
    lengths = [3, 30, 11]
    prompts = _prompts(lengths, seed=2)
    pool, cache = _paged(model)
    for row, n in enumerate(lengths):
        cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n + 8)))
    _forward(model, cache, [0, 1, 2], prompts)
    seqs = [list(p) for p in prompts]
    for step in range(8):
        nxt = [(7 * step + 3 * b) % 250 + 1 for b in range(3)]
        logits = _forward(model, cache, [0, 1, 2], [[t] for t in nxt])[:, 0]  # (3, V)
        for b in range(3):
            seqs[b].append(nxt[b])
            with torch.no_grad():
                alone = model.compute_logits(model(torch.tensor([seqs[b]]),
                                                   torch.arange(len(seqs[b]))[None]))[0, -1]
            assert relative_logit_error(logits[b], alone) < 1e-5


def test_gathered_rectangle_is_the_longest_row(model):
    pool, cache = _paged(model)
    for row, n in enumerate([3, 40]):
        cache.tables[row].extend(pool.allocate(pool.blocks_for_length(n + 1)))
    _forward(model, cache, [0, 1], _prompts([3, 40], seed=3))
    step = cache.begin_step([0, 1], [1, 1])
    assert step.read_cells.shape == (2, 41)  # row 0 has 4 tokens and pays for 41
    cache.end_step()


def test_position_beyond_max_model_len_is_refused(model):
    pool, cache = _paged(model, max_len=8)
    cache.tables[0].extend(pool.allocate(2))
    _forward(model, cache, [0], [list(range(1, 9))])
    with pytest.raises(ValueError, match="beyond max_model_len=8"):
        cache.begin_step([0], [1])


def test_reset_row_returns_blocks_and_forgets(model):
    pool, cache = _paged(model)
    cache.tables[1].extend(pool.allocate(3))
    _forward(model, cache, [1], [list(range(1, 10))])
    pool.free(cache.reset_row(1))
    pool.check_invariants()
    assert pool.num_free == pool.num_blocks and cache.lengths[1] == 0
    assert bool((cache.slots.cells[1] == -1).all())


def test_held_row_does_not_grow(model):
    pool, cache = _paged(model)
    cache.tables[0].extend(pool.allocate(2))
    _forward(model, cache, [0], [[5, 6, 7]])
    for _ in range(3):
        _forward(model, cache, [0], [[9]], hold=frozenset({0}))
    assert cache.lengths[0] == 3


def test_scattered_blocks_give_the_same_logits(model):
    """Blocks out of order and far apart: only the cell arithmetic can make this agree."""
    prompt = _prompts([21], seed=9)[0]
    _, cache = _paged(model, num_blocks=32)
    cache.tables[1].extend([17, 3, 29, 0, 11, 8])  # 24 cells, deliberately scrambled
    got = _forward(model, cache, [1], [prompt])[0, :21]
    with torch.no_grad():
        want = model.compute_logits(model(torch.tensor([prompt]), torch.arange(21)[None]))[0]
    assert relative_logit_error(got, want) < 1e-5
    assert cache.slots.cells[1, :6].tolist() == [68, 69, 70, 71, 12, 13]


def test_a_malformed_step_is_refused(model):
    _, cache = _paged(model)
    with pytest.raises(ValueError, match="distinct rows"):
        cache.begin_step([0, 0], [1, 1])
    with pytest.raises(ValueError, match="distinct rows"):
        cache.begin_step([], [])
    with pytest.raises(ValueError, match="at least one token"):
        cache.begin_step([0], [0])
