"""The benchmarks' workloads: seeded prompts, a seeded arrival process, and ragged batches.

Why this module exists: two measurements compare only if they send the same requests (and, for
a server, at the same moments). Every workload is drawn here from one seed, apart from any engine
or server, so a run is reproducible and its arithmetic is testable without a model.

The serving workload (``random_requests``, ``arrival_times``) follows vLLM's
``benchmark_serving``:

- prompts are vLLM's *random* dataset: token ids drawn uniformly, lengths drawn uniformly from
  ``[len * (1 - range_ratio), len * (1 + range_ratio)]`` (``range_ratio=0`` gives fixed lengths);
- request *intervals* are drawn from a gamma distribution with ``shape=burstiness`` and
  ``scale=1 / (rate * burstiness)``, so the mean interval is ``1 / rate`` whatever the shape.
  ``burstiness=1`` is a Poisson process (exponential gaps); below 1 the arrivals bunch up, above
  1 they space out evenly. ``rate=inf`` sends every request at once.

The offline workload (``make_workload``, ``nanoserve bench offline``) is ragged on purpose:
prompt and output lengths drawn uniformly from ``[min, max]`` with Python's ``random`` (the
draws Day 53 froze), every request greedy with EOS ignored, so its useful tokens are exactly its
budgets. ``wave_accounting`` bills the same budgets as static waves, where every row decodes
until its wave's longest member is done.

```pycon
>>> arrival_times(4, float("inf"), 1.0, seed=0)
[0.0, 0.0, 0.0, 0.0]
>>> [r.prompt_len for r in random_requests(3, 8, 4, 0.0, vocab_size=100, seed=0)]
[8, 8, 8]
>>> wl = make_workload(4, prompt_lens=(2, 6), gen_lens=(1, 8), vocab_size=100, seed=5)
>>> wl.max_tokens, wl.useful_tokens   # static waves [1, 8] and [4, 1] decode 2x8 + 2x4 rows
([1, 8, 4, 1], 14)
>>> wave_accounting(wl.max_tokens, batch=2)["computed_tokens"]
24

```
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """One request of the workload: what to send and how long it should be."""

    prompt: list[int] | str  # token ids, or text decoded from them
    prompt_len: int
    expected_output_len: int


def _lengths(rng: np.random.Generator, n: int, length: int, range_ratio: float) -> list[int]:
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.floor(length * (1 + range_ratio)))
    return [int(x) for x in rng.integers(low, high + 1, size=n)]


def random_requests(num_requests: int, input_len: int, output_len: int, range_ratio: float,
                    vocab_size: int, seed: int, low_id: int = 2, tokenizer=None
                    ) -> list[SampleRequest]:
    """vLLM's random dataset: ``num_requests`` prompts of uniform random token ids.

    Ids are drawn from ``[low_id, vocab_size)`` so that the lowest ids (BOS and EOS in the shipped
    model) stay out of the prompt. With a ``tokenizer`` the ids are decoded to text and
    ``prompt_len`` is the length of that text re-encoded, which is what the server will count.
    """
    if num_requests < 1 or input_len < 1 or output_len < 1:
        raise ValueError("num_requests, input_len and output_len must be at least 1")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if vocab_size <= low_id:
        raise ValueError(f"vocab_size {vocab_size} leaves no ids at or above {low_id}")
    rng = np.random.default_rng(seed)
    in_lens = _lengths(rng, num_requests, input_len, range_ratio)
    out_lens = _lengths(rng, num_requests, output_len, range_ratio)
    out = []
    for n_in, n_out in zip(in_lens, out_lens, strict=True):
        ids = [int(x) for x in rng.integers(low_id, vocab_size, size=n_in)]
        if tokenizer is None:
            out.append(SampleRequest(ids, n_in, n_out))
        else:
            text = tokenizer.decode(ids)
            n = len(tokenizer.encode(text, add_special_tokens=False))
            out.append(SampleRequest(text, n, n_out))
    return out


def request_intervals(num_requests: int, rate: float, burstiness: float = 1.0,
                      seed: int = 0) -> list[float]:
    """The gap after each request, in seconds: gamma(shape=burstiness, scale=1/(rate*b))."""
    if rate <= 0:
        raise ValueError(f"rate must be positive (or inf), got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    theta = 1.0 / (rate * burstiness)
    return [float(x) for x in rng.gamma(shape=burstiness, scale=theta, size=num_requests)]


def arrival_times(num_requests: int, rate: float, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """When each request is sent, in seconds after the first: the running sum of the intervals.

    vLLM sends a request and then sleeps one interval; summing the intervals up front instead of
    sleeping them one by one keeps late wake-ups from drifting the whole schedule.
    """
    gaps = request_intervals(num_requests, rate, burstiness, seed)
    times, t = [], 0.0
    for gap in gaps:
        times.append(t)
        t += gap
    return times


@dataclass(frozen=True, slots=True)
class Workload:
    """The offline bench's requests: token-id prompts and each one's exact output budget."""

    prompts: list[list[int]]
    max_tokens: list[int]
    seed: int
    prompt_lens: tuple[int, int]
    gen_lens: tuple[int, int]

    @property
    def useful_tokens(self) -> int:
        """The tokens the requests ask for: with EOS ignored, exactly what each one gets."""
        return sum(self.max_tokens)

    @property
    def max_len(self) -> int:
        return max(len(p) + m for p, m in zip(self.prompts, self.max_tokens, strict=True))

    def head(self, n: int, max_tokens: int | None = None) -> Workload:
        """The first ``n`` requests, their budgets capped at ``max_tokens`` (the warm-up)."""
        cap = [min(m, max_tokens) if max_tokens else m for m in self.max_tokens[:n]]
        return Workload(self.prompts[:n], cap, self.seed, self.prompt_lens, self.gen_lens)


def make_workload(requests: int = 16, prompt_lens: tuple[int, int] = (16, 192),
                  gen_lens: tuple[int, int] = (16, 128), vocab_size: int = 2048,
                  seed: int = 0) -> Workload:
    """Seeded: the same arguments give the same prompt ids and output lengths, every time."""
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    for name, (lo, hi) in (("prompt_lens", prompt_lens), ("gen_lens", gen_lens)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be 1 <= min <= max, got {lo},{hi}")
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_lens) for _ in range(requests)]
    gens = [rng.randint(*gen_lens) for _ in range(requests)]
    prompts = [[rng.randrange(2, vocab_size) for _ in range(n)] for n in lens]
    return Workload(prompts, gens, seed, tuple(prompt_lens), tuple(gen_lens))


def static_waves(n: int, batch: int) -> list[list[int]]:
    """Arrival order, ``batch`` requests at a time."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def wave_accounting(max_tokens: list[int], batch: int) -> dict:
    """What static waves cost: every row of a wave decodes until the wave's longest member is
    done, but only each request's own ``max_tokens`` are useful."""
    waves = static_waves(len(max_tokens), batch)
    computed = sum(len(w) * max(max_tokens[i] for i in w) for w in waves)
    useful = sum(max_tokens)
    return {"waves": len(waves), "useful_tokens": useful, "computed_tokens": computed,
            "wasted_tokens": computed - useful}
