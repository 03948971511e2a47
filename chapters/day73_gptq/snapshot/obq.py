"""Day 73 snapshot (frozen): GPTQ's column loop at its smallest, on a fixed grid.

A linear layer's output for an input ``x`` is ``W x``. Rounding ``W`` to ``Q`` changes it by
``(W - Q) x``, and its mean square over the inputs is ``d H d^T`` for each row ``d = w - q``, where
``H`` is the inputs' second-moment matrix ``E[x x^T]`` (GPTQ's Hessian, ``2 X^T X / n``, is twice
it; the factor changes nothing below). Round-to-nearest makes each ``|d_k|`` as small as it can
and ignores ``H``. GPTQ rounds column ``j``, then moves every column not yet rounded by the least
squares correction for the error it just made::

    w[k] -= (w[j] - q[j]) * Hinv[j, k] / Hinv[j, j]      for every k > j

and removes column ``j`` from ``Hinv`` (it is fixed now), so the next correction is for the
columns still free. Here the grid is plain multiples of ``step`` and the inverse is updated
explicitly, column by column; the package (``nanoserve/quantization/gptq.py``) reads the same
numbers off a Cholesky factor, in blocks, with group scales.

Two inputs that move together (correlation 0.9), and a row of two weights of 0.4 on an integer
grid. Round-to-nearest makes both 0; GPTQ rounds the first to 0, hands its 0.4 of missing
output to the second (0.4 + 0.9 * 0.4 = 0.76), which rounds to 1:

>>> import torch
>>> H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
>>> w = torch.tensor([[0.4, 0.4]], dtype=torch.float64)
>>> q, seen = gptq_columns(w, H, step=1.0)
>>> q.tolist(), [round(v, 4) for v in seen[0].tolist()]
([[0.0, 1.0]], [0.4, 0.76])
>>> round(output_error(w - torch.round(w), H), 4), round(output_error(w - q, H), 4)
(0.608, 0.088)
>>> sorted(round(output_error(w - torch.tensor([[a, b]], dtype=torch.float64), H), 4)
...        for a in (0.0, 1.0) for b in (0.0, 1.0))
[0.088, 0.088, 0.608, 1.368]
"""

from __future__ import annotations

import torch


def gptq_columns(w: torch.Tensor, H: torch.Tensor, step: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` (N, K) rounded column by column to multiples of ``step`` against ``H`` (K, K):
    (the rounded weights (N, K), each column's value when it was rounded (N, K))."""
    w = w.clone()
    Hinv = torch.linalg.inv(H)  # (K, K)
    q, seen = torch.empty_like(w), torch.empty_like(w)
    for j in range(w.shape[1]):
        seen[:, j] = w[:, j]
        q[:, j] = torch.round(w[:, j] / step) * step
        err = (w[:, j] - q[:, j]) / Hinv[j, j]  # (N,)
        w[:, j:] -= err[:, None] * Hinv[j, j:][None, :]  # column j lands on q; later ones pay
        Hinv = Hinv - Hinv[:, j:j + 1] @ Hinv[j:j + 1, :] / Hinv[j, j]  # column j is fixed
    return q, seen


def output_error(d: torch.Tensor, H: torch.Tensor) -> float:
    """The mean squared output error ``sum over rows of d H d^T`` of a weight error ``d`` (N, K)."""
    return float(torch.einsum("nk,kj,nj->", d, H, d))
