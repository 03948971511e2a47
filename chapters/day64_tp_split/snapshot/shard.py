"""Day 64 snapshot (frozen): the shard plan, from a checkpoint's config.json alone.

Megatron's cut of a Llama over ``tp`` ranks. Column-parallel (output rows split): q, k, v by
heads, gate and up by MLP columns, the embedding and the LM head by vocabulary rows. Row-parallel
(input columns split, then an all-reduce): the attention output and the MLP's down projection.
Norms are whole on every rank; a row-parallel bias lives on rank 0 only.

KV heads go to ranks in contiguous groups as even as whole heads allow, and each query head
goes with the KV head it reads. Fewer KV heads than ranks: each KV head is replicated on the
ranks that share it, which needs ``tp`` a multiple of the KV heads and of nothing else but the
query heads. The MLP must divide. The vocabulary is cut in ``ceil(V / tp)`` rows per rank, the
last rank's shard padded with zero rows.

>>> s = Shape(heads=9, kv_heads=3, intermediate=1536, vocab=49152, head_dim=64)
>>> [plan(s, 2, r).kv for r in (0, 1)], [plan(s, 2, r).q for r in (0, 1)]
([(0, 1), (1, 3)], [(0, 3), (3, 9)])
>>> plan(Shape(8, 4, 688, 2048, 32), 3, 0)
Traceback (most recent call last):
ValueError: tensor_parallel_size=3 does not divide intermediate_size=688
"""

from __future__ import annotations

from dataclasses import dataclass

COLUMN = {"self_attn.q_proj": "q", "self_attn.k_proj": "kv", "self_attn.v_proj": "kv",
          "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp"}
ROW = {"self_attn.o_proj": "q", "mlp.down_proj": "mlp"}
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int

    @classmethod
    def of(cls, config: dict) -> Shape:
        hq = config["num_attention_heads"]
        return cls(hq, config.get("num_key_value_heads", hq), config["intermediate_size"],
                   config["vocab_size"],
                   config.get("head_dim") or config["hidden_size"] // hq)


@dataclass(frozen=True)
class Plan:
    tp: int
    rank: int
    q: tuple[int, int]  # query heads [start, end)
    kv: tuple[int, int]  # KV heads [start, end)
    mlp: tuple[int, int]  # MLP columns [start, end)
    vocab: tuple[int, int]  # real vocabulary rows [start, end)
    vocab_shard: int  # rows in every rank's shard, padding included
    replicated: bool

    def cut(self, name: str, head_dim: int) -> tuple[str, int, int]:
        """How HF tensor ``name`` is cut: ("rows" | "cols" | "whole" | "vocab", start, end)."""
        if name in VOCAB:
            return "vocab", *self.vocab
        part = name.split(".", 3)[3].rpartition(".")[0] if name.startswith("model.layers.") \
            else ""
        for table, how in ((COLUMN, "rows"), (ROW, "cols")):
            if part in table:
                kind = table[part]
                lo, hi = getattr(self, kind)
                scale = 1 if kind == "mlp" else head_dim
                return how, lo * scale, hi * scale
        return "whole", 0, 0


def plan(s: Shape, tp: int, rank: int) -> Plan:
    if s.kv_heads < tp and tp % s.kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} is above num_key_value_heads="
                         f"{s.kv_heads} and not a multiple of it")
    if s.kv_heads < tp and s.heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} does not divide num_attention_heads="
                         f"{s.heads}")
    if s.intermediate % tp:
        raise ValueError(f"tensor_parallel_size={tp} does not divide intermediate_size="
                         f"{s.intermediate}")
    group = s.heads // s.kv_heads
    if s.kv_heads < tp:
        kv = (rank * s.kv_heads // tp, rank * s.kv_heads // tp + 1)
        q = (rank * s.heads // tp, (rank + 1) * s.heads // tp)
    else:
        kv = (rank * s.kv_heads // tp, (rank + 1) * s.kv_heads // tp)
        q = (kv[0] * group, kv[1] * group)
    m = s.intermediate // tp
    shard = -(-s.vocab // tp)
    vocab = (min(rank * shard, s.vocab), min((rank + 1) * shard, s.vocab))
    return Plan(tp, rank, q, kv, (rank * m, (rank + 1) * m), vocab, shard, s.kv_heads < tp)
