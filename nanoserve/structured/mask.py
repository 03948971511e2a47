"""The batch's bitmask: the constrained rows' allowed tokens, applied to their logits.

Why this module exists: a grammar says, before each token, which ids may come next. The
sampler must never draw another, whatever temperature, top-p or penalties do, so the mask is
applied first: one (n, ceil(V / 32)) int32 tensor for the n constrained rows of the step, each
row filled by its request's matcher, then every disallowed logit set to -inf. Rows without a
grammar are not touched.

Two ways to apply it, the same result: on a CPU with nanoserve's C++ ops loaded,
``apply_token_bitmask`` walks each row's words once, in place (Day 68); elsewhere the words are
unpacked into an (n, V) boolean and the rows masked in PyTorch (Day 67's path, and the op's
reference).
"""

from __future__ import annotations

import torch

BITS = torch.arange(32, dtype=torch.int32)


def fill(matchers: list, vocab_size: int) -> torch.Tensor:
    """(n, ceil(V / 32)) int32: bit j of word w of row i allows token 32 w + j."""
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    mask = allocate_token_bitmask(len(matchers), vocab_size)
    for i, m in enumerate(matchers):
        fill_next_token_bitmask(m, mask, i)
    return mask


def allowed(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(n, W) int32 -> (n, V) bool."""
    bits = (mask[:, :, None] >> BITS) & 1  # (n, W, 32)
    return bits.reshape(mask.shape[0], -1)[:, :vocab_size].bool()


def fused() -> bool:
    """Whether the C++ op is there (loaded by the engine; never built from here)."""
    from nanoserve.cpu import csrc

    return csrc.loaded()


def apply(logits: torch.Tensor, rows: list[int], matchers: list) -> torch.Tensor:
    """``logits`` (B, V) with the disallowed tokens of ``rows`` at -inf (a copy if any)."""
    if not rows:
        return logits
    return apply_words(logits, rows, fill(matchers, logits.shape[1]))


def apply_words(logits: torch.Tensor, rows: list[int], words: torch.Tensor) -> torch.Tensor:
    """``apply`` with the masks already filled: ``words`` (n, ceil(V / 32)), one per row of
    ``rows`` (speculative decoding fills one per position, walking a matcher ahead)."""
    V = logits.shape[1]
    out = logits.clone()
    if out.device.type == "cpu" and out.dtype == torch.float32 and fused():
        torch.ops.nanoserve.apply_token_bitmask(out, torch.tensor(rows, dtype=torch.int64),
                                                words)
        return out
    ok = allowed(words, V).to(logits.device)  # (n, V)
    out[rows] = out[rows].masked_fill(~ok, float("-inf"))
    return out
