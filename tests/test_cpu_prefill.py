"""Fresh prompts through the decode kernel (nanoserve/cpu/prefill.py) against packed SDPA.

Each prompt token read as a decode row over its prefix must give causal attention: held against
``packed_prefill_attention`` (SDPA per prompt) on packed streams of several prompts, with K/V in
scattered pool blocks, over GQA groups, a head_dim with a scalar tail and block sizes of 1 to 32.
The engine's greedy tokens with it are held to the reference path in test_fused_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from nanoserve.attention.causal import packed_prefill_attention
from nanoserve.cpu import csrc
from nanoserve.cpu.prefill import attend_prompts, token_tables

pytestmark = pytest.mark.skipif(csrc.load() is not None, reason=str(csrc.load()))


def _stream(lens, hkv, group, d, bs, dtype, seed):
    """A packed stream's q, k, v (1, H, N, D), its cells (every prompt in its own scattered
    blocks, each starting a block) and pools holding k and v there."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // bs) for n in lens]
    order = torch.randperm(sum(widths) + 5, generator=g)
    cells, used = [], 0
    for n, w in zip(lens, widths, strict=True):
        blocks = order[used:used + w]
        used += w
        cells.append((blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[:n])
    cells = torch.cat(cells)
    N = sum(lens)
    q = torch.randn(1, hkv * group, N, d, generator=g).to(dtype)
    k = torch.randn(1, hkv, N, d, generator=g).to(dtype)
    v = torch.randn(1, hkv, N, d, generator=g).to(dtype)
    kp = torch.full(((sum(widths) + 5) * bs, hkv, d), float("nan"), dtype=dtype)  # unowned: NaN
    vp = kp.clone()
    kp[cells], vp[cells] = k[0].transpose(0, 1), v[0].transpose(0, 1)
    return q, k, v, cells, kp, vp


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("lens,hkv,group,d,bs", [
    ([5, 40, 1, 17], 3, 3, 64, 16),
    ([33], 1, 8, 72, 1),
    ([70, 2], 2, 1, 48, 32),
    ([16, 16, 100], 2, 4, 128, 16),
])
def test_each_token_reads_its_prefix_as_causal_attention_does(lens, hkv, group, d, bs, dtype,
                                                               atol):
    q, k, v, cells, kp, vp = _stream(lens, hkv, group, d, bs, dtype, seed=len(lens) + d)
    tables, ctx = token_tables(cells, lens, [True] * len(lens), bs)
    got = attend_prompts(q, kp, vp, tables, ctx, bs)
    want = packed_prefill_attention(q, k, v, lens)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_the_tables_name_each_prompts_blocks_and_positions():
    cells = torch.tensor([32, 33, 34, 35, 36, 8, 9, 10, 12, 13, 14, 15, 48, 49, 50, 51])
    tables, ctx = token_tables(cells, [5, 3, 8], [True, False, True], 4)
    assert tables[:5].tolist() == [[8, 9]] * 5  # cells 32.. and 36: blocks 8 and 9
    assert ctx.tolist() == [1, 2, 3, 4, 5, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8]
    assert tables[5:8].tolist() == [[-1, -1]] * 3  # a continued row: never read this way
    assert tables[8:].tolist() == [[3, 12]] * 8  # cells 12..15, then 48..


def test_a_fresh_prompt_that_does_not_start_a_block_is_refused():
    with pytest.raises(ValueError, match="start each of its blocks"):
        token_tables(torch.tensor([5, 6, 7]), [3], [True], 4)


@pytest.mark.parametrize("options", [
    dict(),  # every step's prompts fresh: the whole packed stream
    dict(max_num_batched_tokens=8, block_size=4),  # fresh runs beside continued chunks, decodes
], ids=["packed", "mixed"])
def test_the_engine_reads_fresh_prompts_through_the_kernel_and_no_token_moves(monkeypatch,
                                                                               options):
    from nanoserve import LLM, SamplingParams
    from nanoserve.attention.backends import cpu as backend

    prompts = [[0, *range(3 + i, 9 + 5 * i)] for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=5 + i, ignore_eos=True) for i in range(6)]
    kw = dict(dtype="float32", skip_tokenizer_init=True, max_num_seqs=4, max_model_len=96,
              **options)
    want = [o.token_ids for o in LLM(kernels=False, attention="reference", **kw).generate(
        prompts, params)]
    calls = []
    real = backend.attend_prompts
    monkeypatch.setattr(backend, "attend_prompts",
                        lambda *a: calls.append(a[0].shape[2]) or real(*a))
    llm = LLM(kernels=True, attention="cpu", **kw)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    layers = llm.model.cfg.num_hidden_layers
    if not options:  # every prompt token, once per layer
        assert sum(calls) == layers * sum(map(len, prompts))
    else:  # a first chunk of each prompt, at least
        assert len(calls) >= layers and sum(calls) >= layers * len(prompts)
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("start,n,bs", [(16, 9, 16), (5, 30, 4), (40, 1, 1), (31, 33, 32)])
def test_a_continued_chunk_reads_its_rows_blocks_as_the_reference_does(start, n, bs, dtype,
                                                                       atol):
    from nanoserve.attention.reference import paged_attention_batched_reference
    from nanoserve.cpu.prefill import chunk_tables

    g = torch.Generator().manual_seed(start + n)
    hkv, group, d, total = 2, 3, 64, start + n
    width = -(-total // bs)
    blocks = torch.randperm(width + 4, generator=g)[:width]
    row_cells = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[:total]  # (S,) by position
    kp = torch.randn((width + 4) * bs, hkv, d, generator=g).to(dtype)
    vp = torch.randn((width + 4) * bs, hkv, d, generator=g).to(dtype)
    q = torch.randn(1, hkv * group, n, d, generator=g).to(dtype)
    tables, ctx = chunk_tables(row_cells, start, n, bs)
    assert tables.shape == (n, width) and ctx.tolist() == list(range(start + 1, total + 1))
    got = attend_prompts(q, kp, vp, tables, ctx, bs)
    want = paged_attention_batched_reference(q, kp, vp, row_cells[None],
                                             torch.arange(start, total)[None],
                                             torch.tensor([total]))
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
