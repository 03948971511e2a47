"""Day 54 snapshot (frozen): the small-M matmul's weight layout, its arithmetic, and the rule
that decides, per weight shape, which batches take it.

Why this module exists: at decode sizes (M = 1..8 rows) a linear layer reads each weight once
and uses it M times, so it runs at the speed the weight streams from memory. The C++ kernel
(AVX512-BF16's ``dpbf16`` dot product) reads the weight repacked into blocks of 32 output
features, each input pair interleaved, so that one block is one contiguous stream and one
instruction multiplies a pair of inputs against 16 outputs::

    weight (N, K)  ->  packed (Nb, K/2, 32, 2),  Nb = ceil(N / 32)
    packed[nb, kk, j, p] = weight[32 nb + j, 2 kk + p]     (zero past N or K)

It sums in float32 and rounds to bf16 once, like ``small_gemm_reference``. Whether it beats
oneDNN depends on the processor, so nothing here reads CPU flags: the engine times both at 1,
2, 4 and 8 rows per weight shape, and ``small_rows`` turns the timings into a choice.

    >>> small_rows({1: 2.0, 2: 1.7, 4: 0.9, 8: 0.5})   # oneDNN time / small time
    2
    >>> small_rows({1: 0.7, 2: 0.6, 4: 0.4, 8: 0.4})   # never: the weight stays oneDNN's alone
    0
    >>> pack(torch.arange(4.0).view(1, 4)).shape
    torch.Size([1, 2, 32, 2])
"""

from __future__ import annotations

import torch

ROWS = (1, 2, 4, 8)  # the batch sizes each shape is timed at
BLOCK_N = 32  # output features per packed block: two AVX-512 registers of float32


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (Nb, ceil(K/2), 32, 2): the layout ``pack_small_gemm`` writes."""
    N, K = weight.shape
    Nb, K2 = -(-N // BLOCK_N), -(-K // 2)
    padded = weight.new_zeros(Nb * BLOCK_N, K2 * 2)
    padded[:N, :K] = weight
    return padded.view(Nb, BLOCK_N, K2, 2).permute(0, 2, 1, 3).contiguous()


def small_gemm_reference(x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T in float32 (bf16 products are exact there), rounded once."""
    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def small_rows(ratios: dict[int, float]) -> int:
    """The largest timed batch size up to which the small kernel won at every size (0: none).

    ``ratios[m]`` is oneDNN's time over the small kernel's at m rows; > 1 means small wins."""
    rows = 0
    for m in ROWS:
        if ratios[m] <= 1.0:
            break
        rows = m
    return rows
