"""Day 78 snapshot (frozen): what a proposal may cost before speculation stops paying.

Leviathan et al.'s model of a verify step: each of ``k`` proposals is accepted with probability
``a``, independently, until the first rejection, and the target adds one token of its own, so a
step writes ``(1 - a^(k+1)) / (1 - a)`` tokens on average. Making the ``k`` proposals costs
``k c`` target steps (``c``: one draft step over one target step) and checking them one target
step, so the speed-up over plain decoding is that count over ``1 + k c``. Prompt lookup has
``c`` near zero; a draft model's ``c`` is what its forward costs beside the target's.

Where the target is bound by reading its weights, ``c`` is the draft's bytes over the target's.
A draft cut from the target (its first layers, with the same embeddings and head) still reads
the whole head every step, so for a small model with a large vocabulary ``c`` cannot fall far.

>>> expected_tokens(0.0, 4), expected_tokens(1.0, 4), round(expected_tokens(0.5, 4), 4)
(1.0, 5.0, 1.9375)
>>> round(predicted_speedup(0.8, 4, 0.1), 3), predicted_speedup(1.0, 4, 1.0)
(2.401, 1.0)
>>> round(break_even_c(0.5, 4), 4)
0.2344
>>> round(break_even_a(break_even_c(0.5, 4), 4), 6)
0.5
>>> layer = dict(hidden_size=4, intermediate_size=8, num_attention_heads=2,
...              num_key_value_heads=1, head_dim=2, vocab_size=10, num_hidden_layers=3)
>>> step_weights(layer, 3), step_weights(layer, 1)   # layers of 144 weights, a head of 40
(472, 184)
"""

from __future__ import annotations


def expected_tokens(a: float, k: int) -> float:
    """Tokens a verify step writes on average: accepted proposals and the target's own."""
    if not 0 <= a <= 1 or k < 1:
        raise ValueError(f"a={a} must be in [0, 1] and k={k} >= 1")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: int, c: float) -> float:
    """Tokens a step writes over what the step costs in target steps, ``1 + k c``."""
    if c < 0:
        raise ValueError(f"c={c} must be >= 0")
    return expected_tokens(a, k) / (1 + k * c)


def break_even_c(a: float, k: int) -> float:
    """The draft step cost at which speculation at acceptance ``a`` gains nothing."""
    return (expected_tokens(a, k) - 1) / k


def break_even_a(c: float, k: int) -> float:
    """The acceptance rate below which a draft of cost ``c`` slows decoding (1.0: none
    suffices, as when ``c >= 1``). ``expected_tokens`` grows with ``a``, so bisect."""
    if predicted_speedup(1.0, k, c) <= 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_speedup(mid, k, c) < 1 else (lo, mid)
    return hi


def step_weights(config: dict, layers: int) -> int:
    """Weights one decode step reads for a Llama-shaped model cut to its first ``layers``:
    the attention and MLP projections of each layer, and the head (``vocab x hidden``; one row
    of the embedding is read, which is left out). Norms are a few thousand weights: left out."""
    h, i = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q = config["num_attention_heads"] * d
    kv = config["num_key_value_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return layers * per_layer + config["vocab_size"] * h
