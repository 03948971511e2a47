"""The paged kernels' sliding window against their PyTorch references, over random windows.

The C++ decode kernel (``paged_decode_attention``, ``window=``) is held to
``decode_attention_reference`` and the Triton kernel (interpreter on a CPU) to the rectangle's
``paged_attention_batched_reference``, by hypothesis over the window (1 token to past the
context), the block size, head_dim (whole registers or not), the GQA group and ragged contexts,
decode rows and, for Triton, query positions inside a row (a chunk). The blocks wholly before a
row's window are poisoned: their table entries are -1 or name a block of NaNs, as a block given
back to the pool and reused might, so a kernel that read one would fault, be refused or return
NaN. Each token of a prompt read as a decode row through ``cpu.prefill`` sees the window the
uncached forward's mask gives it.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nanoserve.attention.causal import causal_attention
from nanoserve.attention.reference import paged_attention_batched_reference
from nanoserve.cpu import csrc

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
NO_OPS = pytest.mark.skipif(csrc.load() is not None, reason=str(csrc.load()))
NO_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                               reason="triton is not installed")


def poisoned_case(lens, window, block_size, hkv, group, head_dim, seed, dtype=torch.float32):
    """Pools and (B, W) block tables (-1 past each row's end) whose blocks wholly before each
    row's window are -1 (given back) or the NaN block (reused by someone else); the rectangle
    of cells (B, S) a reference reads, with the dropped positions at -1 too."""
    g = torch.Generator().manual_seed(seed)
    B, width = len(lens), -(-max(lens) // block_size)
    num_blocks = B * width + 2
    kp = torch.randn(num_blocks * block_size, hkv, head_dim, generator=g).to(dtype)
    vp = torch.randn(num_blocks * block_size, hkv, head_dim, generator=g).to(dtype)
    nan_block = num_blocks - 1
    kp[nan_block * block_size:], vp[nan_block * block_size:] = float("nan"), float("nan")
    table = torch.randperm(num_blocks - 1, generator=g)[:B * width].view(B, width).contiguous()
    cells = torch.full((B, max(lens)), -1, dtype=torch.long)
    for b, n in enumerate(lens):
        table[b, -(-n // block_size):] = -1
        p = torch.arange(n)
        cells[b, :n] = table[b, p // block_size] * block_size + p % block_size
        gone = max(0, n - window) // block_size  # blocks wholly before the window
        table[b, :gone] = torch.tensor([-1, nan_block])[torch.arange(gone) % 2]
    q = torch.randn(B, hkv * group, head_dim, generator=g).to(dtype)
    return q, kp, vp, table, cells, torch.tensor(lens)


CASE = dict(window=st.integers(1, 80), block_size=st.integers(1, 20),
            head_dim=st.sampled_from([8, 24, 32, 40, 64]), hkv=st.integers(1, 2),
            group=st.integers(1, 6), lens=st.lists(st.integers(1, 120), min_size=1, max_size=3),
            seed=st.integers(0, 2**16))


@NO_OPS
@SETTINGS
@given(**CASE, dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_the_cpu_kernel_reads_only_the_window(window, block_size, head_dim, hkv, group, lens,
                                              seed, dtype):
    from nanoserve.cpu.csrc.reference import decode_attention_reference

    q, kp, vp, table, _, ctx = poisoned_case(lens, window, block_size, hkv, group, head_dim,
                                             seed, dtype)
    out = torch.empty_like(q)
    torch.ops.nanoserve.paged_decode_attention(out, q, kp, vp, table, ctx, block_size,
                                               head_dim ** -0.5, window)
    want = decode_attention_reference(q, kp, vp, table, ctx, block_size, window)
    assert not out.isnan().any()
    torch.testing.assert_close(out, want, atol=1e-5 if dtype == torch.float32 else 2e-2, rtol=0)


@NO_OPS
def test_a_long_window_splits_like_a_long_context():
    """Contexts past the kernel's 512-token split, windows shorter and longer than one split:
    the splits start at the window, and a window of 0 (or past the context) is the whole row."""
    from nanoserve.cpu.csrc.reference import decode_attention_reference

    for window in (0, 300, 700, 5000):
        q, kp, vp, table, _, ctx = poisoned_case([1300, 40, 2000], window or 10**6, 16, 2, 3,
                                                 64, window)
        out = torch.empty_like(q)
        torch.ops.nanoserve.paged_decode_attention(out, q, kp, vp, table, ctx, 16, 0.125,
                                                   window)
        want = decode_attention_reference(q, kp, vp, table, ctx, 16, window)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@NO_OPS
@SETTINGS
@given(window=st.integers(1, 40), block_size=st.integers(1, 9), start=st.integers(0, 30),
       n=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_prompt_tokens_as_decode_rows_see_their_window(window, block_size, start, n, seed):
    """A continued chunk read through ``chunk_tables`` and ``attend_prompts``: each token's
    output is the causal mask's over the row, even with the blocks before the chunk's first
    window given back (their table entries -1)."""
    from nanoserve.cpu.prefill import attend_prompts, chunk_tables

    g = torch.Generator().manual_seed(seed)
    total, hkv, hq, d = start + n, 2, 4, 16
    blocks = -(-total // block_size)
    kp = torch.randn((blocks + 1) * block_size, hkv, d, generator=g)
    vp = torch.randn_like(kp)
    order = torch.randperm(blocks + 1, generator=g)[:blocks]
    p = torch.arange(total)
    row_cells = order[p // block_size] * block_size + p % block_size  # (total,)
    q = torch.randn(1, hq, n, d, generator=g)
    keys, values = kp[row_cells].transpose(0, 1)[None], vp[row_cells].transpose(0, 1)[None]
    want = causal_attention(q, keys, values, q_offset=start, window=window)
    gone = max(0, start + 1 - window) // block_size
    row_cells[:gone * block_size] = -1  # the blocks no token of the chunk can see: given back
    tables, ctx = chunk_tables(row_cells, start, n, block_size, window)
    got = attend_prompts(q, kp, vp, tables, ctx, block_size, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@NO_OPS
def test_decode_layers_refuses_a_window_list_of_another_length():
    h = torch.zeros(1, 8)
    pools = torch.zeros(1, 16, 1, 8)
    one = [torch.ones(8)]
    with pytest.raises(RuntimeError, match="windows must be empty or one per layer"):
        torch.ops.nanoserve.decode_layers(
            h, h.clone(), one, one, one, [None], one, [None], one, [None], one, [None],
            torch.ones(1, 8), torch.zeros(1, 8), pools, pools.clone(), torch.zeros(1).long(),
            torch.zeros(1, 1).long(), torch.ones(1).long(), 16, 1, 1, 4, 1e-6, 1.0, [3, 3])


@NO_TRITON
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASE, T=st.integers(1, 3), splits=st.sampled_from([1, 3]))
@example(window=1, block_size=2, head_dim=8, hkv=1, group=1, lens=[2], seed=0, T=1, splits=3)
@example(window=20, block_size=16, head_dim=32, hkv=2, group=4, lens=[300, 7], seed=1, T=1,
         splits=8)  # split-K segments wholly before the window: they must weigh 0, not NaN
def test_the_triton_kernel_reads_only_the_window(window, block_size, head_dim, hkv, group, lens,
                                                 seed, T, splits):
    """Decode rows (T = 1) and T query tokens at the end of each row (each with its own
    horizon), one pass or split-K: the rectangle's answer, no NaN from a dropped block."""
    from nanoserve.cuda.kernels import paged_attention

    q1, kp, vp, table, cells, ctx = poisoned_case(lens, window + T - 1, block_size, hkv, group,
                                                  head_dim, seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), q1.shape[1], T, head_dim, generator=g)
    pos = torch.stack([torch.arange(n - T, n).clamp(min=0) for n in lens])  # (B, T)
    out = paged_attention(q, kp, vp, table, ctx, block_size, pos if T > 1 else None,
                          splits=splits, tile=16, window=window)
    want = paged_attention_batched_reference(q, kp, vp, cells, pos, ctx, window)
    assert not out.isnan().any()
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
