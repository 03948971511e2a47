"""SamplingParams (vLLM's names, defaults and meaning) and the sampler that applies them.

Why this module exists: every request carries its own decoding rules, and a batch mixes greedy
rows with sampled ones. The parameters are validated once, at the door, so a bad value is a
``ValueError`` naming the field rather than a NaN three layers down. The sampler then turns one
row of logits per request into one token id per request.

The order of operations follows vLLM: temperature, then top-k, then top-p, then a draw.
Temperature 0 (below 1e-5, as in vLLM) means greedy (argmax), with no randomness consumed.
Top-p keeps the smallest set of tokens whose probability reaches ``top_p``, *including* the token
that crosses the threshold:

>>> import torch
>>> probs = torch.tensor([[0.5, 0.3, 0.2]])
>>> top_p_mask(probs, torch.tensor([0.6])).tolist()  # 0.5 < 0.6, so 0.3 is kept too
[[True, True, False]]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

SAMPLING_EPS = 1e-5  # temperatures below this are greedy; dividing by them overflows


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    seed: int | None = None
    max_tokens: int | None = 16  # None: until the context is full
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also catches NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def check_vocab(self, vocab_size: int) -> None:
        for t in self.stop_token_ids:
            if not 0 <= t < vocab_size:
                raise ValueError(f"stop_token_ids: token id {t} is outside the vocabulary "
                                 f"(vocab_size={vocab_size})")

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A per-request generator, so a seeded request draws the same tokens in any batch."""
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8)) >> 1
        g.manual_seed(seed)  # never touches the global RNG
        return g


def top_k_mask(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """logits (B, V), k (B,) with 0 meaning off -> keep-mask (B, V) with exactly k per row
    (ties at the k-th value are broken by the sort, so never more than k survive)."""
    V = logits.shape[-1]
    k = torch.where(k <= 0, V, k.clamp(max=V))
    order = logits.argsort(dim=-1, descending=True)  # (B, V)
    ranks = torch.arange(V, device=logits.device).expand_as(order)
    return torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, ranks < k[:, None])


def top_p_mask(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """probs (B, V), p (B,) -> keep-mask: tokens whose preceding mass is still below p."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly ahead of each token
    keep_sorted = before < p[:, None]
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits (R, V) of sampled (non-greedy) rows -> the distribution each row draws from."""
    dev = logits.device
    x = logits / torch.tensor([sp.temperature for sp in params], device=dev)[:, None]
    k = torch.tensor([sp.top_k for sp in params], device=dev)
    x = x.masked_fill(~top_k_mask(x, k), float("-inf"))
    probs = x.softmax(dim=-1)
    p = torch.tensor([sp.top_p for sp in params], device=dev)
    if (p < 1).any():  # top_p = 1 is "off": a float32 cumsum can reach 1.0 before the tail
        keep = top_p_mask(probs, p) | (p[:, None] >= 1)
        probs = probs.masked_fill(~keep, 0.0)
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """logits (B, V) float32 -> token ids (B,). Greedy rows take the argmax."""
    out = logits.argmax(dim=-1)
    rows = [i for i, sp in enumerate(params) if not sp.greedy]
    if not rows:
        return out
    probs = filtered_probs(logits[rows], [params[i] for i in rows])  # (R, V)
    for j, i in enumerate(rows):
        out[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return out
