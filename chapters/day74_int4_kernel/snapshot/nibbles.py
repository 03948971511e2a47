"""Day 74 snapshot (frozen): the int4 kernel's layout and its arithmetic, in plain PyTorch.

The C++ kernel repacks a (N, K) int4 weight once, at load, into blocks of 32 output features.
A block is K/8 chunks of 128 bytes: two 64-byte lines, outputs 0-15 then 16-31. Each output
owns one 32-bit lane of its line and keeps there the 8 nibbles of its 8 inputs of the chunk,
two's complement, in the order k = 0, 2, 4, 6, 1, 3, 5, 7 (lane position p holds
k = 2p for p < 4 and k = 2(p - 4) + 1 after). ``locate`` says where one weight lives.

Widening nibble p of every lane is one shift right by 4p and one 16-entry table lookup indexed
by the low 4 bits, which is what vpermps does: it reads only those bits of each index, so no
mask is needed. ``gemm`` then sums each group of inputs in float32 and applies the group's scale
once, the zero point through each row's sum over the group:

    out[m, n] = sum_g scale[n, g] * (sum_{k in g} x[m, k] q[n, k] - zero[n, g] * sx[m, g])

>>> import torch
>>> locate(37, 13, 576)       # output 37, input 13: block 1, byte 151 of it, low nibble
(1, 151, 0)
>>> q = (torch.arange(32 * 16).reshape(32, 16) % 16 - 8).to(torch.int8)
>>> packed = pack(q)
>>> packed.shape              # (blocks, chunks, bytes)
torch.Size([1, 2, 128])
>>> hex(lane(packed, 0, 0))   # output 0's first chunk: q = -8..-1, k-order 0,2,4,6,1,3,5,7
'0xfdb9eca8'
>>> unpack_nibble(torch.tensor([lane(packed, 0, 0)]), 4).tolist()   # p = 4 is k = 1
[-7.0]
>>> g = torch.Generator().manual_seed(0)
>>> x = torch.randn(3, 16, generator=g)
>>> scale, zero = torch.rand(32, 2, generator=g), torch.randint(-8, 8, (32, 2), generator=g)
>>> w = (q.float() - zero.float().repeat_interleave(8, 1)) * scale.repeat_interleave(8, 1)
>>> bool(torch.allclose(gemm(x, packed, scale, zero, 8, 32), x @ w.t(), atol=1e-5))
True
"""

from __future__ import annotations

import torch

BLOCK = 32  # outputs per block
# the value each 4-bit pattern stands for, two's complement: 0..7, then -8..-1
TABLE = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1],
                     dtype=torch.float32)
K_OF_P = [0, 2, 4, 6, 1, 3, 5, 7]  # the input (within a chunk) each lane position holds


def locate(n: int, k: int, K: int) -> tuple[int, int, int]:
    """Output ``n``'s input ``k`` -> (block, byte within the block, shift within the byte)."""
    j, c, i = n % BLOCK, k // 8, k % 8
    p = K_OF_P.index(i)
    return n // BLOCK, c * 128 + (j // 16) * 64 + (j % 16) * 4 + p // 2, 4 * (p % 2)


def pack(q: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 in [-8, 7], K a multiple of 8 -> (ceil(N / 32), K / 8, 128) uint8."""
    N, K = q.shape
    Nb = -(-N // BLOCK)
    nib = torch.zeros(Nb * BLOCK, K, dtype=torch.int64)
    nib[:N] = q.to(torch.int64) & 0xF  # two's complement nibbles; padding outputs are 0
    # (Nb, 2 lines, 16 lanes, K/8 chunks, 8 positions): position p holds input K_OF_P[p]
    nib = nib.view(Nb, 2, 16, K // 8, 8)[..., K_OF_P]
    words = (nib << (4 * torch.arange(8))).sum(-1)  # (Nb, 2, 16, K/8) 32-bit lanes
    words = words.permute(0, 3, 1, 2)  # (Nb, K/8, 2, 16): chunk, line, lane
    as_bytes = (words[..., None] >> (8 * torch.arange(4))) & 0xFF  # little-endian
    return as_bytes.to(torch.uint8).reshape(Nb, K // 8, 128)


def lane(packed: torch.Tensor, n: int, c: int) -> int:
    """The 32-bit lane holding output ``n``'s nibbles of chunk ``c``."""
    j = n % BLOCK
    b = packed[n // BLOCK, c, (j // 16) * 64 + (j % 16) * 4:][:4].tolist()
    return b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24


def unpack_nibble(lanes: torch.Tensor, p: int) -> torch.Tensor:
    """Nibble ``p`` of each 32-bit lane as float32: shift right by 4p, then look the low 4 bits
    up in the table (the permute ignores the bits above them)."""
    return TABLE[(lanes >> (4 * p)) & 0xF]


def gemm(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
         group_size: int, N: int) -> torch.Tensor:
    """x (M, K) float32 -> (M, N): sums per group, the scale applied once per group."""
    M, K = x.shape
    Nb, chunks, _ = packed.shape
    b = packed.to(torch.int64).view(Nb, chunks, 2, 16, 4)
    lanes = (b << (8 * torch.arange(4))).sum(-1)  # (Nb, K/8, 2, 16)
    w = torch.stack([unpack_nibble(lanes, p) for p in range(8)], -1)  # (Nb, K/8, 2, 16, 8)
    w = w[..., [K_OF_P.index(i) for i in range(8)]]  # positions back to input order
    w = w.permute(0, 2, 3, 1, 4).reshape(Nb * BLOCK, K)[:N]  # (N, K) integers as float
    G = K // group_size
    sums = torch.einsum("mgk,ngk->mng", x.view(M, G, group_size), w.view(N, G, group_size))
    if zero is not None:  # sum x (q - z) = sum x q - z sum x
        sums = sums - zero.float()[None] * x.view(M, G, group_size).sum(-1)[:, None]
    return (sums * scale[None]).sum(-1)
