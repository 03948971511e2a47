"""Triton kernels (Week 14): the paged-attention read, without the rectangle.

Why this package exists: every attention path before it builds something the size of the batch's
longest context before it can score a token (the reference's (B, S) cell rectangle, the gathered
mapping's chunks). ``paged_attention`` reads K/V through the block table itself, one block id at
a time, and keeps its softmax in registers, so the one-pass path materialises nothing but the
output.

Triton is an optional dependency (the ``kernels`` extra). On a machine without CUDA the kernels run
under Triton's interpreter, which has to be chosen before triton is first imported
(``nanoserve.cuda.triton_mode`` says why). Importing this package never chooses it: without CUDA it
refuses unless the caller did, by setting ``TRITON_INTERPRET`` (``1``: the interpreter; ``0``: the
compiler, which is what ``tools/kernel_aot.py`` wants) or by calling
``nanoserve.cuda.triton_mode.use_interpreter()`` first, as the Triton attention backend does before
the model is built (``TritonBackend.prepare_process``). It also refuses kernels built in another
mode than triton's own helpers.
"""

from __future__ import annotations

from nanoserve.cuda.triton_mode import require_choice, require_one_mode

require_choice()  # before the first triton import below

from nanoserve.cuda.kernels.paged_attention import (  # noqa: E402
    _paged_attention_kernel,
    choose_splits,
    paged_attention,
    paged_attention_triton,
    workspace_bytes,
)

require_one_mode(_paged_attention_kernel)

__all__ = ["choose_splits", "paged_attention", "paged_attention_triton", "workspace_bytes"]
