"""Day 67 snapshot (frozen): the bitmask a grammar fills, and the two rewrites of a spec.

A step's mask for n constrained rows is an (n, ceil(V / 32)) int32 tensor: bit j of word w of
row i says whether token 32 w + j may come next in row i. Unpacking it is a shift and an and;
applying it sets every disallowed logit to -inf before anything samples.

>>> words = torch.tensor([[0b101, 0]], dtype=torch.int32)  # tokens 0 and 2 of 40
>>> unpack(words, 40)[0].nonzero().flatten().tolist()
[0, 2]
>>> choice_regex(["a.b", "c"])
'a\\\\.b|c'
>>> s = closed({"type": "object", "properties": {"x": {"type": "object", "properties": {}}}})
>>> s["additionalProperties"], s["properties"]["x"]["additionalProperties"]
(False, False)
"""

from __future__ import annotations

import re

import torch


def unpack(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(n, W) int32 -> (n, V) bool: which tokens each row allows."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (words[:, :, None] >> shifts) & 1  # (n, W, 32)
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def masked(logits: torch.Tensor, rows: list[int], ok: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` (B, V) whose ``rows`` keep only the tokens ``ok`` (len(rows), V)
    allows."""
    out = logits.clone()
    out[rows] = out[rows].masked_fill(~ok, float("-inf"))
    return out


def choice_regex(choices: list[str]) -> str:
    """A choice is a regex: the alternatives, each taken literally."""
    return "|".join(re.escape(c) for c in choices)


def closed(schema):
    """``strict``: every object with ``properties`` and no word on extra ones gets
    ``additionalProperties: false``."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
