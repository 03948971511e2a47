"""Day 64's numbers: the split of three shapes, the refusals, the bytes each rank reads, and
``-tp 2`` against ``-tp 1`` on the shipped model in float32.

The plans come from the package's ``ShardPlan`` and are held against the frozen snapshot's;
the slices are read by the package from the shipped safetensors file and rejoined here against
the file's own tensors; the two engines run nanoserve-tiny in float32 (the tp=2 one spawns one
worker process over gloo on 127.0.0.1).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

from chapters.common import SHIPPED
from chapters.runner import bound, exact

from .snapshot.shard import Shape, plan

PROMPTS = ["The while statement", "Once upon a time there was", "def f(x):", "A list is",
           "import os\nimport sys\n", "class Stack:", "The quick brown fox jumps over", "x = 1"]


def _cfg(name: str = "tiny"):
    from nanoserve.bench.shapes import shape_config
    from nanoserve.config import ModelConfig

    return ModelConfig.from_dict(shape_config(name))


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}"


def describe(cfg, tp: int) -> str:
    from nanoserve.tp.shard import ShardPlan

    out = []
    for r in range(tp):
        p = ShardPlan(cfg, tp, r)
        mlp = p.local.intermediate_size
        out.append(f"rank {r}: query heads {_span(*p.q_heads)}, KV heads {_span(*p.kv_heads)}, "
                   f"MLP columns {_span(r * mlp, (r + 1) * mlp)}, vocabulary rows "
                   f"{_span(*p.vocab_rows)}" + (f" +{p.vocab_pad} padding" if p.vocab_pad
                                                else ""))
    return "; ".join(out)


def replicated() -> str:
    from nanoserve.tp.shard import ShardPlan

    plans = [ShardPlan(_cfg(), 8, r) for r in range(8)]
    sharing = {p.kv_heads for p in plans}
    return (f"{len(plans)} ranks, {plans[0].local.num_attention_heads} query head each; "
            f"{len(sharing)} KV heads, each on {len(plans) // len(sharing)} ranks")


def refusals() -> str:
    from nanoserve.tp.shard import ShardPlan

    out = []
    for tp in (3, 6):
        try:
            ShardPlan(_cfg(), tp, 0)
        except ValueError as e:
            out.append(str(e).split(":")[0])
    return "; ".join(out)


def frozen_agrees() -> str:
    """The snapshot's plan against the package's, rank by rank, over a grid of shapes."""
    from nanoserve.tp.shard import ShardPlan

    agree = total = refused = 0
    for hkv, group, inter, vocab, tp in itertools.product((1, 2, 3, 4, 8), (1, 2, 3),
                                                          (688, 1536), (255, 2048), range(1, 9)):
        cfg = replace(_cfg(), num_attention_heads=hkv * group, num_key_value_heads=hkv,
                      intermediate_size=inter, vocab_size=vocab)
        shape = Shape.of({"num_attention_heads": hkv * group, "num_key_value_heads": hkv,
                          "intermediate_size": inter, "vocab_size": vocab, "head_dim": 32})
        for r in range(tp):
            total += 1
            try:
                ours = ShardPlan(cfg, tp, r)
            except ValueError:
                ours = None
            try:
                frozen = plan(shape, tp, r)
            except ValueError:
                frozen = None
            if ours is None or frozen is None:
                agree += ours is None and frozen is None
                refused += ours is None and frozen is None
                continue
            agree += (ours.q_heads, ours.kv_heads, ours.vocab_rows, ours.local.vocab_size,
                      ours.replicated_kv) == (frozen.q, frozen.kv, frozen.vocab,
                                              frozen.vocab_shard, frozen.replicated)
    return f"{agree} of {total} agree ({refused} refused by both)"


@functools.cache
def slices() -> tuple:
    from safetensors import safe_open

    from nanoserve.config import ModelConfig
    from nanoserve.tp.load import read_slices
    from nanoserve.tp.shard import ShardPlan

    cfg = ModelConfig.from_dir(SHIPPED)
    parts = [read_slices(SHIPPED, ShardPlan(cfg, 2, r)) for r in range(2)]
    with safe_open(next(SHIPPED.glob("*.safetensors")), framework="pt") as f:
        whole = {name: f.get_tensor(name) for name in f.keys()}
    return parts, whole


def bytes_read() -> str:
    parts, whole = slices()
    total = sum(t.numel() * t.element_size() for t in whole.values())
    return "; ".join(f"rank {r}: {n:,} of {total:,} B ({n / total:.1%})"
                     for r, (_, n) in enumerate(parts))


def rejoined() -> str:
    import torch

    from nanoserve.tp.shard import LAYER_SPLIT, VOCAB_SPLIT

    (a, _), (b, _) = slices()[0]
    whole = slices()[1]
    ok = 0
    for name, full in whole.items():
        part = name.split(".", 3)[3].rpartition(".")[0] if name.startswith("model.layers.") \
            else ""
        kind = "rows" if name in VOCAB_SPLIT else LAYER_SPLIT.get(part, "whole")
        if kind.endswith("cols") and name.endswith("bias"):
            ok += torch.equal(a[name], full) and not b[name].any()
        elif kind.endswith("cols"):
            ok += torch.equal(torch.cat([a[name], b[name]], dim=1), full)
        elif kind == "whole":
            ok += torch.equal(a[name], full) and torch.equal(b[name], full)
        else:
            ok += torch.equal(torch.cat([a[name], b[name]])[:len(full)], full)
    return f"{ok} of {len(whole)}"


@functools.cache
def pair() -> dict:
    from nanoserve import LLM, SamplingParams
    from nanoserve.testing import greedy_logits

    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    one = LLM(SHIPPED, dtype="float32")
    ids = [one.tokenizer.encode(p) for p in PROMPTS]
    ref_tokens = [o.token_ids for o in one.generate(PROMPTS, params)]
    ref_logits = [greedy_logits(one, i, 8) for i in ids]
    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2) as two:
        tokens = [o.token_ids for o in two.generate(PROMPTS, params)]
        logits = [greedy_logits(two, i, 8) for i in ids]
    diff = max((x - y).abs().max().item() for a, b in zip(logits, ref_logits, strict=True)
               for x, y in zip(a, b, strict=True))
    return {"same": sum(a == b for a, b in zip(tokens, ref_tokens, strict=True)),
            "n": len(PROMPTS), "diff": diff}


def identical() -> str:
    p = pair()
    return f"{p['same']} of {p['n']} identical"


CLAIMS = [
    exact("nanoserve-tiny (8 query heads, 4 KV heads, MLP 688, vocabulary 2048) over 2 ranks",
          lambda: describe(_cfg(), 2)),
    exact("SmolLM2-135M's shape (9 query heads, 3 KV heads, MLP 1536, vocabulary 49152) over 2 "
          "ranks", lambda: describe(_cfg("smollm2-135m"), 2)),
    exact("nanoserve-tiny over 8 ranks", replicated),
    exact("nanoserve-tiny over 3 and over 6 ranks", refusals),
    exact("the frozen plan against the package's, rank by rank: 5 KV-head counts x 3 group "
          "sizes x 2 MLP widths x 2 vocabularies x tp 1-8", frozen_agrees),
    exact("bytes of the shipped checkpoint each of 2 ranks reads", bytes_read),
    exact("tensors whose two slices rejoin to the checkpoint's own", rejoined),
    exact("greedy tokens, -tp 2 against -tp 1, nanoserve-tiny float32, 8 prompts x 32 tokens",
          identical),
    bound("max |logit difference|, -tp 2 against -tp 1, nanoserve-tiny float32, 8 prompts x 8 "
          "steps", lambda: pair()["diff"], fmt="{:.2e}".format),
]
