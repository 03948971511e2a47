"""Triton kernels (Week 14): the paged-attention read, without the rectangle.

Why this package exists: every attention path before it builds something the size of the batch's
longest context before it can score a token (the reference's (B, S) cell rectangle, the gathered
mapping's chunks). ``paged_attention`` reads K/V through the block table itself, one block id at
a time, and keeps its softmax in registers, so the one-pass path materialises nothing but the
output.

Triton is an optional dependency (the ``kernels`` extra). On a machine without CUDA the kernels run
under Triton's interpreter, which is decided when ``@triton.jit`` runs (triton's own helpers
are decorated when triton is imported), so this package sets ``TRITON_INTERPRET=1`` before the
first triton import, unless the caller already chose (``TRITON_INTERPRET=0`` keeps the
compiler, which is what the H200 compile test wants), and refuses if triton came first.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    if "triton" in sys.modules:  # its own @jit helpers (tl.zeros, ...) were built compiled
        raise ImportError("no CUDA here, and triton was imported before nanoserve.kernels "
                          "without TRITON_INTERPRET=1: set it before the first triton import")
    os.environ["TRITON_INTERPRET"] = "1"

from .paged_attention import (  # noqa: E402
    choose_splits,
    paged_attention,
    paged_attention_triton,
    workspace_bytes,
)

__all__ = ["choose_splits", "paged_attention", "paged_attention_triton", "workspace_bytes"]
