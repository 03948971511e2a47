"""Day 66 snapshot (frozen): what one tensor-parallel forward moves, from the shapes alone.

A forward of ``rows`` rows, one new token each (a decode step), over ``tp`` ranks:

- all-reduce: two per layer (after the attention output, after the MLP's down projection) and
  one after the embedding, each of the (rows, hidden) activations in the model's dtype;
- gather: each rank's (rows, ceil(V / tp)) float32 logits to rank 0, once;
- broadcast: rank 0's step message, one ``HEADER`` of 1024 int64s (a long prompt adds a tail).

The bytes are each collective's input tensor, what ``CommStats`` counts; the wire carries
more (a ring all-reduce sends about 2 (tp - 1) / tp of the tensor per rank), and that is
the backend's business.

>>> b = step_bytes(layers=30, hidden=576, vocab=49152, rows=8, tp=2, act_bytes=4)
>>> b["all_reduce_per_layer"], b["all_reduce"], b["gather"], b["broadcast"]
(36864, 1124352, 786432, 8192)
"""

from __future__ import annotations

HEADER_BYTES = 1024 * 8


def step_bytes(layers: int, hidden: int, vocab: int, rows: int, tp: int, act_bytes: int,
               logit_bytes: int = 4, tokens: int | None = None) -> dict[str, int]:
    tokens = rows if tokens is None else tokens  # a decode step: one token a row
    one = tokens * hidden * act_bytes  # one (tokens, hidden) activation
    return {"all_reduce_per_layer": 2 * one, "all_reduce": (2 * layers + 1) * one,
            "all_reduces": 2 * layers + 1, "gather": rows * -(-vocab // tp) * logit_bytes,
            "broadcast": HEADER_BYTES}
