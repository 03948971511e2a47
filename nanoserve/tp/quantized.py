"""A quantized weight cut for one rank: the same split as a dense one, on group boundaries.

Why this module exists: a quantized linear is split across ranks by its layer, as any other
(``shard.py``): column-parallel layers keep their rank's output features of each fused part,
row-parallel ones their rank's inputs. A ``QuantizedWeight`` is cut with ``narrow``, which keeps
the scales (and zero points) that go with the rows or columns kept. Rows can be cut anywhere;
inputs only where the cut falls between groups, because a group's scale covers all its
inputs: ``K / tp`` must be a multiple of the group size, else the split is refused, naming the
layer, ``K / tp`` and the group size. One scale per output feature (``channel``) covers every
input, so each rank keeps it whole over its own inputs.

A rank reads its quantized layers' tensors whole and cuts them after the format's reader has
unpacked them: the packed words and zero points of another format need not fall on the cut.

W8A8 quantizes each row-parallel layer's activations per token over the inputs this rank
holds, as vLLM's CPU build does, so its row-parallel products round as its own slice does, and
``-tp 2`` is not bit-identical to one rank for W8A8 (it is for weight-only schemes).

    qw = cut(plan, "model.layers.0.self_attn.o_proj.weight", qw)
"""

from __future__ import annotations

from dataclasses import replace

from nanoserve.config import ModelConfig
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.tp.shard import LAYER_SPLIT, VOCAB_SPLIT, ShardPlan


def _kind(name: str) -> str:
    if name in VOCAB_SPLIT:
        return "vocab"
    if name.startswith("model.layers."):
        return LAYER_SPLIT.get(name.split(".", 3)[3].rpartition(".")[0], "whole")
    return "whole"


def cut(plan: ShardPlan, name: str, qw: QuantizedWeight) -> QuantizedWeight:
    """Rank ``plan.rank``'s piece of HF weight ``name``, quantized, cut as ``ShardPlan.take``
    cuts a dense one."""
    kind = _kind(name)
    if kind == "whole":
        return qw
    if kind == "vocab":
        start, end = plan.vocab_rows
        rows = qw.narrow(0, start, end - start)
        return rows if not plan.vocab_pad else QuantizedWeight.cat(
            [rows, _zeros(qw, plan.vocab_pad)], name)
    if kind in ("qkv_rows", "gate_up_rows"):
        return QuantizedWeight.cat([qw.narrow(0, a, b - a) for a, b in plan._parts(kind)],
                                   name)
    a, b = plan._range(kind)
    if kind.endswith("rows"):
        return qw.narrow(0, a, b - a)
    return _inputs(plan, name, qw, a, b)


def _inputs(plan: ShardPlan, name: str, qw: QuantizedWeight, a: int, b: int
            ) -> QuantizedWeight:
    """Inputs [a, b) of a row-parallel weight."""
    K = qw.shape[1]
    if qw.groups == 1 and qw.perm is None:  # one scale per row, over whichever inputs
        return replace(qw, q=qw.q.narrow(1, a, b - a), group_size=b - a)
    if qw.perm is not None or a % qw.group_size or (b - a) % qw.group_size:
        raise ValueError(_refusal(name, K, plan.tp, b - a, qw.group_size, qw.perm is not None))
    return qw.narrow(1, a, b - a)


def _refusal(name: str, K: int, tp: int, local: int, group_size: int, act_order: bool) -> str:
    if act_order:
        return (f"{name}: an act-order (desc_act) weight cannot be split over its inputs "
                f"across tensor_parallel_size={tp} ranks: its groups are not contiguous")
    return (f"{name}: tensor_parallel_size={tp} gives each rank {local} of its {K} inputs "
            f"(K/tp), which does not fall on its groups of {group_size}")


def _zeros(qw: QuantizedWeight, rows: int) -> QuantizedWeight:
    """``rows`` output features that compute zero: a padded vocabulary shard's."""
    K, G = qw.shape[1], qw.groups
    zero = None if qw.zero is None else qw.zero.new_zeros(rows, G)
    return replace(qw, q=qw.q.new_zeros(rows, K), scale=qw.scale.new_ones(rows, G), zero=zero)


def check_split(cfg: ModelConfig, tp: int) -> None:
    """Before any worker starts: refuse a compressed-tensors checkpoint whose row-parallel
    layers' groups do not fall on the ranks' cut, from ``config.json`` alone (other formats are
    checked as each rank cuts its weights)."""
    qc = cfg.extra.get("quantization_config")
    if tp == 1 or not qc or qc.get("quant_method") != "compressed-tensors":
        return
    from nanoserve.quantization.compressed_tensors import schemes

    found = schemes(qc)
    ignore = tuple(qc.get("ignore") or ())
    plans = [ShardPlan(cfg, tp, r) for r in range(tp)]
    for i in range(cfg.num_hidden_layers):
        for part, kind, K in (("self_attn.o_proj", "q_cols", cfg.q_size),
                              ("mlp.down_proj", "mlp_cols", cfg.intermediate_size)):
            layer = f"model.layers.{i}.{part}"
            s = next((s for s in found if s.covers(layer)), None)
            if s is None or s.group_size is None or replace(s, targets=ignore).covers(layer):
                continue
            for p in plans:
                a, b = p._range(kind)
                if a % s.group_size or (b - a) % s.group_size:
                    raise ValueError(_refusal(f"{layer}.weight", K, tp, b - a, s.group_size,
                                              False))
