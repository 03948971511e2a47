"""Day 4 snapshot (frozen): greedy generation by recomputing the whole sequence every step.

The simplest correct decoder: to get token t+1, run the model over all t tokens so far and take
the argmax of the last position. Nothing is remembered between steps, so the work for a reply
of N tokens after a P-token prompt is P + (P+1) + ... + (P+N-1) token-forwards.
Imports only torch and the Day 1 snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from chapters.day01_llama_forward.snapshot.model import Llama


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" (an EOS id) or "length" (max_new_tokens)
    tokens_computed: int  # token positions run through the model, summed over steps


@torch.inference_mode()
def generate_uncached(model: Llama, prompt: list[int], max_new_tokens: int,
                      eos_ids: frozenset[int] = frozenset()) -> Generation:
    seq, computed = list(prompt), 0
    for _ in range(max_new_tokens):
        x = torch.tensor([seq])  # (1, T)
        h = model(x, torch.arange(len(seq))[None])  # (1, T, E): every position, every step
        computed += len(seq)
        token = int(model.compute_logits(h[0, -1]).argmax())
        seq.append(token)
        if token in eos_ids:
            return Generation(seq[len(prompt):], "stop", computed)
    return Generation(seq[len(prompt):], "length", computed)
