"""The rectangle read (Day 28): every row's context gathered at the width of the longest.

Why this module exists: once K/V live in scattered pool cells, attention has to find them.
``paged_attention_batched_reference`` is the plain way: gather each row's context through its
slot-table row into a (B, S) rectangle, S being the longest context in the batch, mask what a row
may not see, and run ordinary attention. Every faster read (Day 50's gathered mapping, the C++
kernel, the Triton kernel) is tested against this function, and every backend falls back to it
for the rows its own read does not take (``backends/base.py``).

Its cost is the rectangle: a row with 10 cached tokens in a batch whose longest row has 2,000 is
gathered, and masked, at width 2,000. That is the debt the gathered mapping pays back
(``backends/gathered.py``); ``selector.workspace_bytes`` prices each read's intermediates, so the
two can be compared by counting rather than timing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_batched_reference(q: torch.Tensor, k_pool: torch.Tensor,
                                      v_pool: torch.Tensor, read_cells: torch.Tensor,
                                      q_positions: torch.Tensor,
                                      context_lens: torch.Tensor,
                                      window: int | None = None) -> torch.Tensor:
    """Attention for B rows over their paged contexts.

    q            (B, Hq, T, D)   queries of the new tokens (padding rows/columns allowed)
    k_pool       (cells, Hkv, D) one layer's pool; v_pool likewise
    read_cells   (B, S)          pool cell of each context position, -1 past the row's end
    q_positions  (B, T)          absolute position of each query (its causal horizon)
    context_lens (B,)            tokens in each row's context
    window       a query at position i sees keys j with i - window < j <= i (None: all j <= i),
                 transformers' sliding-window mask; positions are absolute, so a chunk or a
                 decode step reads the same window as a whole prompt would
    returns      (B, Hq, T, D)
    """
    S = read_cells.shape[1]
    cells = read_cells.clamp(min=0)
    keys = k_pool[cells].transpose(1, 2)  # (B, Hkv, S, D)
    values = v_pool[cells].transpose(1, 2)  # (B, Hkv, S, D)
    j = torch.arange(S, device=q.device)
    mask = (j[None, None, :] <= q_positions[:, :, None]) & \
        (j[None, None, :] < context_lens[:, None, None])  # (B, T, S)
    if window is not None:
        mask &= j[None, None, :] > q_positions[:, :, None] - window
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None],
                                          enable_gqa=True)
