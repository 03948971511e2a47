"""Day 71 snapshot (frozen): how one family is held against transformers, and when a check
could have failed.

A parity check takes the logits of each step, ours and the reference's, and asks two things:
the largest absolute difference over every step and every id (in float32 it must stay within
``BOUND``), and whether the greedy choice, the argmax, is the same at every step. A negative
control runs the same check on a model with one feature removed; it is worth something only
when the difference it produces is far outside the bound (``CONTROL``), so that a path
ignoring the feature could not have passed.

>>> import torch
>>> ours = [torch.tensor([0.0, 2.0, 1.0]), torch.tensor([3.0, 0.0, 0.5])]
>>> theirs = [torch.tensor([0.0, 2.0, 1.000001]), torch.tensor([3.0, 0.0, 0.5])]
>>> diff, same = compare(ours, theirs)
>>> diff <= BOUND, same
(True, True)
>>> compare(ours, [torch.tensor([0.0, 1.0, 2.0]), theirs[1]])
(1.0, False)
>>> verdict(3e-6), verdict(4e-5), control_catches(2.4), control_catches(3e-6)
('holds', 'fails', True, False)

Gemma's scores are scaled by ``query_pre_attn_scalar ** -0.5`` where the attention backends
scale by ``head_dim ** -0.5``, so q is multiplied by ``(head_dim / scalar) ** 0.5`` first. That
factor is exact only when the ratio is a power of 4 (the factor is then a power of two):

>>> q_factor_exact(32, 8), q_factor_exact(256, 256), q_factor_exact(128, 168)
(True, True, False)
"""

from __future__ import annotations

from fractions import Fraction

import torch

BOUND = 1e-5  # float32 logits: ours against transformers
CONTROL = 1e-3  # what a removed feature must move the logits by, at least


def compare(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> tuple[float, bool]:
    """Per-step (V,) logits -> (largest |difference| over every step and id, greedy tokens
    identical at every step)."""
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, theirs,
                                                                         strict=True))
    same = all(int(a.argmax()) == int(b.argmax()) for a, b in zip(ours, theirs, strict=True))
    return diff, same


def verdict(diff: float) -> str:
    return "holds" if diff <= BOUND else "fails"


def control_catches(diff: float) -> bool:
    """A feature's removal moved the logits far enough that the parity check would fail."""
    return diff >= CONTROL


def q_factor_exact(head_dim: int, scalar: int) -> bool:
    """Is ``(head_dim / scalar) ** 0.5`` a power of two, so multiplying q by it rounds nothing?"""
    r = Fraction(head_dim, scalar)
    n, d = r.numerator, r.denominator
    if n & (n - 1) or d & (d - 1):
        return False  # not even a power of two
    return (n.bit_length() - d.bit_length()) % 2 == 0
