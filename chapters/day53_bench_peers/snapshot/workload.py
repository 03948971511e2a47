"""The bench's workload, frozen: seeded ragged requests, and the bill of static waves.

Every engine in ``nanoserve bench offline`` runs these exact token ids and output budgets, so
the only thing that differs between two rows of its table is the engine. With EOS ignored, a
request's useful tokens are exactly its budget; a static wave decodes every row until its
longest member is done, so the rest of each row's steps are waste.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]
    seed: int

    @property
    def useful_tokens(self) -> int:
        return sum(self.max_tokens)


def make_workload(requests: int = 16, prompt_lens: tuple[int, int] = (16, 192),
                  gen_lens: tuple[int, int] = (16, 128), vocab_size: int = 2048,
                  seed: int = 0) -> Workload:
    """The same arguments give the same prompts and budgets on every machine (``random``)."""
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_lens) for _ in range(requests)]  # drawn first, then budgets
    gens = [rng.randint(*gen_lens) for _ in range(requests)]
    prompts = [[rng.randrange(2, vocab_size) for _ in range(n)] for n in lens]
    return Workload(prompts, gens, seed)


def static_waves(n: int, batch: int) -> list[list[int]]:
    """Arrival order, ``batch`` requests per wave."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def wave_accounting(max_tokens: list[int], batch: int) -> dict[str, int]:
    """Row-steps a static batch decodes (each wave as long as its longest member) vs useful."""
    waves = static_waves(len(max_tokens), batch)
    computed = sum(len(w) * max(max_tokens[i] for i in w) for w in waves)
    useful = sum(max_tokens)
    return {"waves": len(waves), "useful_tokens": useful, "computed_tokens": computed,
            "wasted_tokens": computed - useful}
