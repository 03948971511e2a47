"""Which slice of every weight a rank holds (Megatron's split), decided before anything starts.

Why this module exists: tensor parallelism cuts each layer so that the ranks multiply their own
pieces and meet only twice a layer, at an all-reduce. The cut is the same for every family
built from Llama's layers (Qwen2, Qwen3, Mistral: ``layers.tp_class``), so it is written down
once, as data, and checked against the model's shapes before a worker process is started or a
byte is read:

- q, k and v projections split by heads (column-parallel): rank r owns a contiguous group of
  KV heads and the query heads that read them. KV heads that do not divide evenly are split as
  evenly as whole heads allow (SmolLM2-135M's 3 over 2 ranks: 1 and 2, ``uneven``); with fewer
  KV heads than ranks each KV head is *replicated* on the ``tp/Hkv`` ranks whose query heads
  share it (``replicated_kv``);
- the output projection split by its input columns (row-parallel), then an all-reduce;
- gate and up split by columns, down by rows, then an all-reduce;
- the embedding and the LM head split over the vocabulary in ``ceil(V/tp)``-row shards, the last
  one padded with zero rows (``vocab_pad``); logits are gathered on rank 0 and trimmed to V;
- a column-parallel bias (Qwen2's q, k and v) split with its rows, so with its heads;
- norms replicated, Qwen3's per-head q/k norms too (one (D,) weight that every head uses);
  a row-parallel bias lives on rank 0 only, so the all-reduce adds it once.

``ShardPlan(cfg, tp, rank).local`` is the ``ModelConfig`` of one rank's model: its heads, its
KV heads, its slice of the MLP and its vocabulary shard, so the model, the KV pool and the fused
ops size themselves from it exactly as they do on one rank.

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
...     "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
...     "num_key_value_heads": 1})
>>> p = ShardPlan(cfg, 2, 1)
>>> p.local.num_attention_heads, p.local.num_key_value_heads, p.replicated_kv, p.vocab_rows
(2, 1, True, (500, 1000))
>>> ShardPlan(cfg, 3, 0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: tensor_parallel_size=3 does not divide num_attention_heads=4: ...
>>> tuple(ShardPlan(replace(cfg, num_attention_heads=9, num_key_value_heads=3), 2, r).q_heads
...       for r in (0, 1))
((0, 3), (3, 9))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from nanoserve.config import ModelConfig

# How each Hugging Face tensor of a layer is cut: "rows" (output features, column-parallel),
# "cols" (input features, row-parallel) or "whole". Names are the part after "model.layers.N.";
# any other (norms, Qwen3's and Gemma 3's per-head q/k norms over D) is read whole. A checkpoint
# that stores q|k|v or gate|up fused (Phi-3) is cut in each part: this rank's q heads, its KV
# heads in k, the same in v; its MLP columns of gate, the same of up.
LAYER_SPLIT = {
    "self_attn.q_proj": "q_rows", "self_attn.k_proj": "kv_rows", "self_attn.v_proj": "kv_rows",
    "self_attn.o_proj": "q_cols", "mlp.gate_proj": "mlp_rows", "mlp.up_proj": "mlp_rows",
    "mlp.down_proj": "mlp_cols", "input_layernorm": "whole", "post_attention_layernorm": "whole",
    "self_attn.qkv_proj": "qkv_rows", "mlp.gate_up_proj": "gate_up_rows",
}
VOCAB_SPLIT = ("model.embed_tokens.weight", "lm_head.weight")  # rows over the vocabulary


@dataclass(frozen=True)
class ShardPlan:
    cfg: ModelConfig  # the checkpoint's, whole
    tp: int
    rank: int
    local: ModelConfig = field(init=False)  # this rank's model

    def __post_init__(self):
        c, tp, r = self.cfg, self.tp, self.rank
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp!r}")
        if not 0 <= r < tp:
            raise ValueError(f"rank {r} is outside tensor_parallel_size={tp}")
        hq, hkv, inter = c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
        if hkv < tp and tp % hkv:
            raise ValueError(f"tensor_parallel_size={tp} is above num_key_value_heads={hkv} "
                             f"and not a multiple of it: the KV heads can be neither split "
                             f"nor replicated whole")
        if hkv < tp and hq % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide num_attention_heads="
                             f"{hq}: with the KV heads replicated each rank needs a whole "
                             f"number of query heads")
        if inter % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide intermediate_size="
                             f"{inter}")
        lo, hi = self.kv_heads
        qlo, qhi = self.q_heads
        local = replace(c, num_attention_heads=qhi - qlo, num_key_value_heads=hi - lo,
                        intermediate_size=inter // tp, vocab_size=-(-c.vocab_size // tp))
        object.__setattr__(self, "local", local)

    @property
    def replicated_kv(self) -> bool:
        """Fewer KV heads than ranks: each KV head is held by tp/Hkv ranks."""
        return self.cfg.num_key_value_heads < self.tp

    @property
    def uneven(self) -> bool:
        """More KV heads than ranks, not a multiple: the ranks hold different head counts."""
        return not self.replicated_kv and self.cfg.num_key_value_heads % self.tp != 0

    @property
    def kv_heads(self) -> tuple[int, int]:
        """[start, end) of the (global) KV heads this rank holds: contiguous groups as even as
        they can be (3 over 2 ranks: head 0, then heads 1-2; rank 0, which also runs the scheduler
        and the sampler, gets the smaller share), or the one head it shares when replicated."""
        hkv, tp, r = self.cfg.num_key_value_heads, self.tp, self.rank
        if hkv < tp:
            return r * hkv // tp, r * hkv // tp + 1
        return r * hkv // tp, (r + 1) * hkv // tp

    @property
    def q_heads(self) -> tuple[int, int]:
        """[start, end) of the query heads: the ones that read this rank's KV heads."""
        hq, hkv = self.cfg.num_attention_heads, self.cfg.num_key_value_heads
        if hkv < self.tp:
            n = hq // self.tp
            return self.rank * n, (self.rank + 1) * n
        lo, hi = self.kv_heads
        return lo * (hq // hkv), hi * (hq // hkv)

    @property
    def vocab_rows(self) -> tuple[int, int]:
        """[start, end) of the vocabulary this rank holds real rows for (end - start may fall
        short of the shard's size on the last rank: the rest is padding)."""
        n = self.local.vocab_size
        return min(self.rank * n, self.cfg.vocab_size), min((self.rank + 1) * n,
                                                            self.cfg.vocab_size)

    @property
    def vocab_pad(self) -> int:
        """Zero rows appended to this rank's vocabulary shard."""
        start, end = self.vocab_rows
        return self.local.vocab_size - (end - start)

    def describe(self) -> str:
        c, lo = self.cfg, self.local
        kv = (f"KV heads replicated ({c.num_key_value_heads} over {self.tp} ranks)"
              if self.replicated_kv else f"{lo.num_key_value_heads} of "
              f"{c.num_key_value_heads} KV heads" + (" (uneven split)" if self.uneven else ""))
        return (f"rank {self.rank}/{self.tp}: {lo.num_attention_heads} query heads, {kv}, "
                f"MLP {lo.intermediate_size} of {c.intermediate_size}, vocabulary rows "
                f"{self.vocab_rows[0]}-{self.vocab_rows[1] - 1} (+{self.vocab_pad} padding)")

    def _range(self, kind: str) -> tuple[int, int]:
        d = self.cfg.head_dim
        if kind.startswith("q"):
            lo, hi = self.q_heads
            return lo * d, hi * d
        if kind.startswith("kv"):
            lo, hi = self.kv_heads
            return lo * d, hi * d
        n = self.local.intermediate_size
        return self.rank * n, (self.rank + 1) * n

    def _parts(self, kind: str) -> list[tuple[int, int]]:
        """[start, end) rows of a fused tensor this rank holds, one range per part: q, k, v
        (rows Hq*D, Hkv*D, Hkv*D) or gate, up (I, I)."""
        c = self.cfg
        if kind == "qkv_rows":
            (qa, qb), (ka, kb) = self._range("q"), self._range("kv")
            q, kv = c.q_size, c.kv_size
            return [(qa, qb), (q + ka, q + kb), (q + kv + ka, q + kv + kb)]
        a, b = self._range("mlp")
        return [(a, b), (c.intermediate_size + a, c.intermediate_size + b)]

    def take(self, name: str, tensor_slice) -> torch.Tensor:
        """This rank's piece of HF tensor ``name``, read through ``tensor_slice`` (a
        ``safe_open(...).get_slice(name)``: only the piece is read from the file)."""
        if name in VOCAB_SPLIT:
            start, end = self.vocab_rows
            got = tensor_slice[start:end]
            if self.vocab_pad:
                got = torch.cat([got, got.new_zeros(self.vocab_pad, *got.shape[1:])])
            return got
        kind, suffix = "whole", name.rpartition(".")[2]
        if name.startswith("model.layers."):  # model.layers.N.<part>.<weight|bias>
            kind = LAYER_SPLIT.get(name.split(".", 3)[3].rpartition(".")[0], "whole")
        if kind == "whole":
            return tensor_slice[:]
        if kind in ("qkv_rows", "gate_up_rows"):  # this rank's rows of each fused part
            return torch.cat([tensor_slice[a:b] for a, b in self._parts(kind)])
        a, b = self._range(kind)
        if kind.endswith("rows"):
            return tensor_slice[a:b]
        if suffix == "bias":  # row-parallel bias: added once, after the all-reduce, by rank 0
            full = tensor_slice[:]
            return full if self.rank == 0 else torch.zeros_like(full)
        return tensor_slice[:, a:b]
