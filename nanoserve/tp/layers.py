"""The three places a tensor-parallel model differs from one rank's: where the ranks meet.

Why this module exists: with the weights cut as ``shard.py`` says, every rank runs the plain
model (its family's own class: Llama, Qwen2, Qwen3, Mistral, ... or the C++ forward of
``nanoserve.cpu.fused``) on its own heads and its own slice of the MLP, and nothing in them knows
there are other ranks. Only three places do:

- the row-parallel linears (the output projection and the MLP's down projection, declared
  ``parallel="row"`` by the model): each rank's product is a partial sum over its input
  columns, so the layer all-reduces the (B, T, E) result (``Linear.all_reduce``), whatever
  linear method computes the product;
- ``VocabParallelEmbedding``: a rank holds rows ``start..end`` of the table, looks up the ids it
  holds, writes zeros for the others, and the all-reduce assembles each token's row;
- ``TensorParallel.compute_logits``: each rank projects onto its vocabulary shard; rank 0
  gathers the shards, drops the padding and hands (B, V) to the sampler. The others get their
  own shard back and nothing else: logits never travel to the workers.

So a layer costs two all-reduces of (tokens, E) and a forward one more (the embedding), and a
step's logits one gather.

A family is built here as itself (``tp_class(Qwen3)`` is a ``Qwen3`` with these three places),
so what it adds to Llama rides along untouched: a per-head q/k norm is over D and its (D,)
weight is every head's, so each rank holds it whole; a layer's window is the family's
``layer_windows`` of the unchanged layer count, read by each rank's own cache and backend. What
a family must provide is checked when it is built (``TensorParallel.__init__``): it says
``tensor_parallel = True``, and every ``Linear`` of its layers says how it is cut.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.layers.linear import Linear
from nanoserve.model.llama import Llama
from nanoserve.tp.comm import Comm
from nanoserve.tp.shard import ShardPlan


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``start .. start + num_embeddings`` of the vocabulary; ids elsewhere look up zeros
    here and their row on the rank that holds it."""

    def __init__(self, num_embeddings: int, embedding_dim: int, start: int, comm: Comm):
        super().__init__(num_embeddings, embedding_dim)
        self.start = start
        self.comm = comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, E)
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # (B, T, E)
        out.masked_fill_(outside[..., None], 0)
        return self.comm.model_all_reduce(out)


class TensorParallel:
    """One rank's model of a family, built from its ``ShardPlan``: ``plan.local`` is this rank's
    shard of the config; the checkpoint's whole vocabulary, to which rank 0 trims the gathered
    logits, is ``plan.cfg.vocab_size``. Mixed in before the family (``tp_class``)."""

    def __init__(self, plan: ShardPlan, comm: Comm, max_model_len: int | None = None):
        super().__init__(plan.local, max_model_len)  # what the family settles from it (Phi-3)
        cfg = plan.local
        self.comm, self.vocab_size, self.shard_plan = comm, plan.cfg.vocab_size, plan
        self.bytes_read = 0  # of the checkpoint, by this rank's load (tp/load.py)
        unhinted = [n for n, m in self.layers.named_modules()
                    if isinstance(m, Linear) and m.parallel is None]
        if unhinted:  # a replicated linear inside a layer would be a split one read whole
            raise ValueError(f"{type(self).__name__}: layers.{unhinted[0]} declares no "
                             f"parallel= ('column' or 'row'): tensor parallelism cannot tell "
                             f"how to cut it")
        if type(self.embed_tokens) is not nn.Embedding:  # a scale belongs in the forward
            raise ValueError(f"{type(self).__name__}: embed_tokens is a "
                             f"{type(self.embed_tokens).__name__}, not an nn.Embedding: its "
                             f"vocabulary-parallel replacement would drop what it adds")
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size,
                                                   plan.vocab_rows[0], comm)
        self.tie_weights()  # a tied head reads this rank's shard of the table
        for m in self.modules():
            if isinstance(m, Linear) and m.parallel == "row":
                m.all_reduce = comm.model_all_reduce

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, E) -> (B, V) on rank 0 (float32); (B, V/tp) of its own shard elsewhere."""
        local = super().compute_logits(hidden).contiguous()  # (B, Vs)
        if self.comm.rank:
            return self.comm.model_gather_last(local)  # its own shard, after sending it
        return self.comm.model_gather_last(local)[..., :self.vocab_size]  # (B, V)


@functools.cache
def tp_class(family: type) -> type:
    """``family`` with ``TensorParallel`` before it (``TPQwen3`` is a ``Qwen3``); a family
    that does not say ``tensor_parallel = True`` is refused by name."""
    if not getattr(family, "tensor_parallel", False):
        raise ValueError(f"tensor parallelism does not build {family.__name__}: the family "
                         f"does not declare tensor_parallel = True")
    return type(f"TP{family.__name__}", (TensorParallel, family),
                {"__doc__": f"One rank's {family.__name__} (``TensorParallel``).",
                 "__module__": __name__})


TPLlama = tp_class(Llama)
