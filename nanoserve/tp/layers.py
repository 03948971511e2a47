"""The three places a tensor-parallel Llama differs from one rank's: where the ranks meet.

Why this module exists: with the weights cut as ``shard.py`` says, every rank runs the plain
model (``model.py``, or the C++ forward of ``fused.py``) on its own heads and its own slice of
the MLP, and nothing in them knows there are other ranks. Only three modules do:

- ``RowParallel`` wraps the output projection and the MLP's down projection: each rank's
  product is a partial sum over its input columns, so it all-reduces the (B, T, E) result;
- ``VocabParallelEmbedding``: a rank holds rows ``start..end`` of the table, looks up the ids it
  holds, writes zeros for the others, and the all-reduce assembles each token's row;
- ``TPLlama.compute_logits``: each rank projects onto its vocabulary shard; rank 0 gathers the
  shards, drops the padding and hands (B, V) to the sampler. The others get their own shard
  back and nothing else: logits never travel to the workers.

So a layer costs two all-reduces of (tokens, E) and a forward one more (the embedding), and a
step's logits one gather. The wrapped linear stays an ``nn.Linear`` child, so packing
(``prepack.py``) still finds and replaces it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.model.llama import Llama
from nanoserve.tp.comm import Comm


class RowParallel(nn.Module):
    """``linear`` over this rank's input columns, then the sum over ranks: (..., E)."""

    def __init__(self, linear: nn.Module, comm: Comm):
        super().__init__()
        self.linear = linear
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.model_all_reduce(self.linear(x).contiguous())


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


class TPLlama(Llama):
    """One rank's Llama: ``cfg`` is this rank's shard (``ShardPlan.local``); ``vocab_size`` the
    checkpoint's whole vocabulary, to which rank 0 trims the gathered logits."""

    def __init__(self, cfg, comm: Comm, vocab_size: int, vocab_start: int):
        super().__init__(cfg)
        self.comm, self.vocab_size = comm, vocab_size
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size,
                                                   vocab_start, comm)
        for layer in self.layers:
            layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, comm)
            layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, comm)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, E) -> (B, V) on rank 0 (float32); (B, V/tp) of its own shard elsewhere."""
        local = super().compute_logits(hidden).contiguous()  # (B, Vs)
        if self.comm.rank:
            return self.comm.model_gather_last(local)  # its own shard, after sending it
        return self.comm.model_gather_last(local)[..., :self.vocab_size]  # (B, V)
