"""GPTQ: rounding a linear layer's weights column by column, each column's error paid back by the
columns not yet rounded.

Why this module exists: round-to-nearest (``rtn.py``) rounds every weight on its own, so the
errors of one row add up in its output. GPTQ (Frantar et al., 2022) minimises the layer's output
error on calibration inputs ``X`` instead, ``||X W^T - X Q^T||^2``, whose curvature in each row
is the same matrix ``H = 2 X^T X / n`` (K, K). It rounds one input column ``j`` at a time and
moves every later column ``k`` by ``-err_j * Hinv[j, k] / Hinv[j, j]``, the exact least-squares
correction (the "optimal brain surgeon" update) for the columns still free. Three things make it
fast and stable, all from the paper:

- ``H`` is damped by ``damp * mean(diag H)`` on its diagonal; an input that is always zero (a dead
  column, ``H[j, j] == 0``) gets 1 on the diagonal and a weight of 0;
- the inverse's rows are read from the upper Cholesky factor of ``H^-1``, which already holds
  what the sequential eliminations leave (no inverse is updated in the loop);
- columns are taken in blocks of ``block_size``: the error feedback runs within a block, and the
  block's accumulated errors reach the later columns in one matrix product ("lazy batch").

Each group's scale and zero point are chosen (``rtn.scales_and_zeros``, compressed-tensors'
min-max rule) from the group's *current* weights, those already moved by the columns before it,
when its first column is reached; the integers are ``rtn.round_to_grid`` against the scale as
stored (``scale_dtype``), so GPTQ's grid is RTN's. No act order: columns go in input order, so
the result is a plain ``QuantizedWeight`` every format here can store.

    H = 2 * X.T @ X / len(X)                     # X (n, K): the layer's calibration inputs
    qw = gptq(w, H, bits=4, group_size=32, symmetric=True)
"""

from __future__ import annotations

import torch

from nanoserve.quantization.rtn import round_to_grid, scales_and_zeros
from nanoserve.quantization.weight import QuantizedWeight


def inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1`` (K, K)."""
    K = H.shape[0]
    H = H + damp * torch.diag(H).mean() * torch.eye(K, dtype=H.dtype)
    L, info = torch.linalg.cholesky_ex(H)
    if int(info) != 0 or not torch.isfinite(L).all():
        raise ValueError(f"gptq: the ({K}, {K}) Hessian is not positive definite after damping "
                         f"by {damp}; raise damp or calibrate on more tokens")
    return torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)


def gptq(w: torch.Tensor, H: torch.Tensor, bits: int, group_size: int | None = None,
         symmetric: bool = True, damp: float = 0.01, block_size: int = 128,
         scale_dtype: torch.dtype = torch.float32) -> QuantizedWeight:
    """``w`` (N, K) quantized to ``bits`` against the Hessian ``H`` (K, K) of its inputs, in
    groups of ``group_size`` inputs (None: one scale per output feature). Arithmetic runs in
    ``H``'s dtype (float64 gives the exact reference test its precision)."""
    N, K = w.shape
    gs = K if group_size is None else group_size
    if tuple(H.shape) != (K, K):
        raise ValueError(f"gptq: the Hessian is {tuple(H.shape)}; a weight of {(N, K)} "
                         f"needs ({K}, {K})")
    if gs < 1 or K % gs:
        raise ValueError(f"gptq: group_size {gs} does not divide the {K} inputs of a "
                         f"{(N, K)} weight")
    if block_size < 1:
        raise ValueError(f"gptq: block_size {block_size} must be at least 1")
    dt = H.dtype if H.dtype == torch.float64 else torch.float32
    H = H.to(dt).clone()
    W = w.to(dt).clone()  # (N, K): moved as the columns before each one are rounded
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    Hinv = inverse_cholesky(H, damp)  # (K, K) upper
    Q = torch.empty(N, K, dtype=torch.int8)
    scales = torch.empty(N, K // gs, dtype=scale_dtype)
    zeros = None if symmetric else torch.empty(N, K // gs, dtype=torch.int8)
    scale = zero = None
    for b0 in range(0, K, block_size):
        b1 = min(b0 + block_size, K)
        W1 = W[:, b0:b1].clone()  # (N, B): this block, updated column by column
        Err = torch.zeros_like(W1)  # (N, B): each column's error over its Hinv diagonal
        Hb = Hinv[b0:b1, b0:b1]  # (B, B)
        for i in range(b1 - b0):
            col = b0 + i
            if col % gs == 0:  # a group starts: its grid from its current weights
                cur = _current(W, W1, Err, Hinv, b0, b1, i, col, col + gs)  # (N, gs)
                s, zero = scales_and_zeros(cur, bits, symmetric)
                scales[:, col // gs] = s.to(scale_dtype)
                scale = scales[:, col // gs].to(torch.float32)
                if zeros is not None:
                    zeros[:, col // gs] = zero
            q = round_to_grid(W1[:, i:i + 1], scale, zero, bits)[:, 0]  # (N,) int8
            Q[:, col] = q
            deq = q.to(torch.float32) - (0 if zero is None else zero.to(torch.float32))
            err = (W1[:, i] - (deq * scale).to(dt)) / Hb[i, i]  # (N,)
            W1[:, i:] -= err[:, None] * Hb[i, i:][None, :]
            Err[:, i] = err
        W[:, b1:] -= Err @ Hinv[b0:b1, b1:]  # the block's errors reach the later columns
    return QuantizedWeight(Q, scales, zeros, bits, gs).check("gptq")


def _current(W, W1, Err, Hinv, b0, b1, i, start, stop) -> torch.Tensor:
    """Columns ``[start, stop)`` as they stand after columns ``< b0 + i`` were rounded: in the
    block from ``W1``; past it, ``W`` less the block's errors so far (not yet applied)."""
    inside = W1[:, start - b0:min(stop, b1) - b0]
    if stop <= b1:
        return inside
    beyond = W[:, b1:stop] - Err[:, :i] @ Hinv[b0:b0 + i, b1:stop]
    return torch.cat([inside, beyond], dim=1)
