"""The reference backend (Day 28): every read is the rectangle, prompts included.

Why this module exists: it is the read every other backend is tested against, end to end. It
takes no shortcut: a fresh prompt reads its own K/V back through the pool, as a continued chunk
does, and a decode step gathers every row at the width of the longest. It reads a per-layer
sliding window (Mistral), as the gathered backend does: every read masks by absolute position, so a
decode step or a later chunk of a long prompt sees the same window as the whole prompt would.
"""

from __future__ import annotations

from typing import ClassVar

from nanoserve.attention.backends.base import AttentionBackend


class ReferenceBackend(AttentionBackend):
    name = "reference"
    reads: ClassVar[tuple[str, ...]] = ("decode", "prefill")
    packs_fresh_prompts: ClassVar[bool] = False  # every row reads the pool, prompts too
    sliding_window: ClassVar[bool] = True  # every read is the masked rectangle, by position
    repeats_rows: ClassVar[bool] = True  # each decode row reads its own block table

    @classmethod
    def workspace_bytes(cls, context_lens, num_q_heads, num_kv_heads, head_dim, dtype_bytes,
                        chunk=32, block_size=16) -> int:
        """The (B, S) cell rectangle (int64), keys and values gathered at (B, S, Hkv, D), the
        (B, 1, S) bool mask and the (B, Hq, 1, S) score rectangle (float32), S the longest."""
        B, S = len(context_lens), max(context_lens)
        e = dtype_bytes
        return B * S * 8 + 2 * B * S * num_kv_heads * head_dim * e + B * S + \
            B * num_q_heads * S * 4
