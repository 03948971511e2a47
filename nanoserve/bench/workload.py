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

Two more serving workloads, for the days that measure a scheduling feature over HTTP
(``sample_requests`` picks one by its ``--dataset-name``):

- ``prefix_repetition`` (vLLM's dataset of that name, Day 45): ``num_prefixes`` distinct random
  prefixes of ``prefix_len`` ids, each followed in ``num_requests / num_prefixes`` requests by a
  random suffix of ``suffix_len`` ids, the requests shuffled; every request asks for
  ``output_len`` tokens. What a prefix cache can find again is fixed by the seed. vLLM quietly
  sends fewer requests when ``num_requests`` is not a multiple of ``num_prefixes``; here that
  is refused.
- ``long_among_short`` (nanoserve's, Day 42): streaming replies with a long prompt among them.
  Request ``i`` (from 1) is *long* when ``i`` is a multiple of ``long_every``: ``long_len``
  prompt ids and ``long_output_len`` tokens out; the rest are *short*: ``input_len`` ids and
  ``output_len`` tokens out. The order is kept, so the long prompts land evenly among the
  streams; each request carries its class as ``label``.

Both draw with Python's ``random.Random(seed)`` (ids uniform in ``[low_id, vocab_size)``), as
the offline workload does, so a frozen copy in a chapter's snapshot needs no numpy.

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
>>> reqs = prefix_repetition_requests(4, 6, 2, 2, 3, vocab_size=100, seed=0)
>>> len({tuple(r.prompt[:6]) for r in reqs}), [r.prompt_len for r in reqs]
(2, [8, 8, 8, 8])
>>> [r.label for r in long_among_short_requests(6, 4, 8, 32, 3, 2, vocab_size=100, seed=0)]
['short', 'short', 'long', 'short', 'short', 'long']
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
    label: str = ""  # the request's class in a mixed workload ("long", "short"), else ""


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


def _sample(ids: list[int], n_out: int, tokenizer, label: str = "") -> SampleRequest:
    """One request from its prompt ids: sent as ids, or as their text, counted re-encoded."""
    if tokenizer is None:
        return SampleRequest(ids, len(ids), n_out, label)
    text = tokenizer.decode(ids)
    return SampleRequest(text, len(tokenizer.encode(text, add_special_tokens=False)), n_out,
                         label)


def _check_ids(vocab_size: int, low_id: int) -> None:
    if vocab_size <= low_id:
        raise ValueError(f"vocab_size {vocab_size} leaves no ids at or above {low_id}")


def prefix_repetition_requests(num_requests: int, prefix_len: int, suffix_len: int,
                               num_prefixes: int, output_len: int, vocab_size: int, seed: int,
                               low_id: int = 2, tokenizer=None) -> list[SampleRequest]:
    """vLLM's prefix_repetition dataset: ``num_prefixes`` random prefixes, each shared by
    ``num_requests // num_prefixes`` requests that differ in a random suffix, shuffled.

    A prefix's requests share its ids exactly when sent as ids; as text (``tokenizer``) the
    tokenizer may merge across the join, so the shared run can be a token shorter."""
    if num_requests < 1 or num_prefixes < 1 or output_len < 1 or prefix_len < 0:
        raise ValueError("num_requests, num_prefixes and output_len must be at least 1, "
                         "prefix_len at least 0")
    if suffix_len < 1:
        raise ValueError(f"suffix_len must be at least 1, got {suffix_len}")
    if num_requests % num_prefixes:
        raise ValueError(f"num_requests={num_requests} is not a multiple of num_prefixes="
                         f"{num_prefixes}: every prefix gets the same number of requests")
    _check_ids(vocab_size, low_id)
    rng = random.Random(seed)
    out = []
    for _ in range(num_prefixes):
        prefix = [rng.randrange(low_id, vocab_size) for _ in range(prefix_len)]
        for _ in range(num_requests // num_prefixes):
            suffix = [rng.randrange(low_id, vocab_size) for _ in range(suffix_len)]
            out.append(_sample(prefix + suffix, output_len, tokenizer))
    rng.shuffle(out)
    return out


def long_among_short_requests(num_requests: int, input_len: int, output_len: int,
                              long_len: int, long_every: int, long_output_len: int,
                              vocab_size: int, seed: int, low_id: int = 2, tokenizer=None
                              ) -> list[SampleRequest]:
    """Short prompts with long streamed replies, and every ``long_every``-th request (the
    ``long_every``-th, the ``2 * long_every``-th, ...) a long prompt with a short reply."""
    if min(num_requests, input_len, output_len, long_len, long_every, long_output_len) < 1:
        raise ValueError("every count and length of long_among_short must be at least 1")
    _check_ids(vocab_size, low_id)
    rng = random.Random(seed)
    out = []
    for i in range(1, num_requests + 1):
        long = i % long_every == 0
        ids = [rng.randrange(low_id, vocab_size) for _ in range(long_len if long else input_len)]
        out.append(_sample(ids, long_output_len if long else output_len, tokenizer,
                           "long" if long else "short"))
    return out


DATASETS = ("random", "prefix_repetition", "long_among_short")


def sample_requests(dataset_name: str, num_requests: int, vocab_size: int, seed: int,
                    tokenizer=None, **options) -> list[SampleRequest]:
    """The requests of the dataset ``dataset_name`` (one of ``DATASETS``), its own arguments
    in ``options`` by their names: ``random`` takes ``input_len``, ``output_len`` and
    ``range_ratio``; ``prefix_repetition`` ``prefix_len``, ``suffix_len``, ``num_prefixes`` and
    ``output_len``; ``long_among_short`` ``input_len`` and ``output_len`` (the short requests),
    ``long_len``, ``long_every`` and ``long_output_len``. A missing or unknown one is refused."""
    import inspect

    fn = {"random": random_requests, "prefix_repetition": prefix_repetition_requests,
          "long_among_short": long_among_short_requests}.get(dataset_name)
    if fn is None:
        raise ValueError(f"dataset_name={dataset_name!r}; choose one of {DATASETS}")
    kwargs = dict(num_requests=num_requests, vocab_size=vocab_size, seed=seed,
                  tokenizer=tokenizer, **options)
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"the {dataset_name} dataset: {e}") from None
    return fn(**kwargs)


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
