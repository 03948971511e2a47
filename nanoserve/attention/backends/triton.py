"""The Triton paged-attention kernel as a backend (Week 14): decode reads the block table itself.

Why this module exists: the kernel (``nanoserve.cuda.kernels``) walks each row's context through
its block table and keeps the softmax online, so a decode step materialises nothing but its
output. Prompts keep going through the shared packed path, which reads fresh K/V without the
pool. Without CUDA the kernel runs under Triton's interpreter, which must be chosen before
anything imports triton: ``prepare_process`` does that, before the model is built.

A layer's sliding window (Mistral's) is the kernel's ``window``: a decode row skips every block
before its window and masks inside the first one it keeps; the shared paths take it too (fresh
prompts through ``packed_prefill_attention``, continued chunks through the rectangle).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from nanoserve.attention.backends.base import AttentionBackend
from nanoserve.cuda.triton_mode import use_interpreter


class TritonBackend(AttentionBackend):
    name = "triton"
    reads: ClassVar[tuple[str, ...]] = ("decode",)
    sliding_window: ClassVar[bool] = True  # the kernel's window, and the shared paths'

    def __init__(self, cache):
        from nanoserve.cuda import kernels  # a missing Triton mode fails here, not mid-step

        super().__init__(cache)
        self._kernels = kernels

    @classmethod
    def prepare_process(cls) -> None:
        use_interpreter()  # without CUDA: the interpreter, before the model build imports triton

    def plan_decode(self, step, rows, ctx, cells) -> None:
        step.read = self.block_ids(rows, ctx)  # (B, W)

    def decode(self, q, kp, vp, positions, step) -> torch.Tensor:
        return self._kernels.paged_attention(q, kp, vp, step.read, step.context_lens,
                                             self.cache.block_size, window=self.window)

    @classmethod
    def workspace_bytes(cls, context_lens, num_q_heads, num_kv_heads, head_dim, dtype_bytes,
                        chunk=32, block_size=16) -> int:
        """The (B, ceil(S / block_size)) int64 block ids, and only on the split-K path the
        float32 partial outputs and log-sum-exps (``nanoserve.cuda.kernels.workspace_bytes``)."""
        from nanoserve.cuda.kernels.paged_attention import workspace_bytes as kernel_bytes

        return kernel_bytes(len(context_lens), num_q_heads, num_kv_heads, head_dim,
                            -(-max(context_lens) // block_size), block_size)
