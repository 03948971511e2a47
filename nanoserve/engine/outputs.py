"""What the engine core hands out: a request's news each step, its counters, and a snapshot.

Why this module exists: the front doors (``LLM``, ``AsyncLLM``, the server's metrics) read the
core through these records only, copies rather than handles, so nothing above the core touches
the engine, the scheduler or the KV manager, and the core can change inside without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from nanoserve.spec_decode.stats import SpecDecodingStats


@dataclass(slots=True)
class RequestDelta:
    """One request's news from one iteration: what its consumer has not seen yet."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list  # TokenLogprob per new token when params.logprobs is set, else []
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    error: str | None = None  # what went wrong, when finish_reason == "error"
    # params.prompt_logprobs: once, with the first token, vLLM's shape: None for the first
    # prompt token, then one TokenLogprob per prompt token (None in every other delta)
    prompt_logprobs: list | None = None


@dataclass(slots=True)
class CoreCounters:
    """Cumulative, for the engine's whole life: what metrics and ``LLM.stats`` read."""

    iterations: int = 0  # steps that ran the model
    requests_added: int = 0
    requests_finished: int = 0
    requests_failed: int = 0  # finished with "error": a forward raised in their step
    by_reason: dict = field(default_factory=dict)  # finish_reason -> count


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """What the core holds and has done, read at one moment; a copy, never a handle."""

    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    block_size: int
    num_preemptions: int
    iterations: int
    requests_added: int
    requests_finished: int
    requests_failed: int
    by_reason: MappingProxyType  # finish_reason -> count
    decode_steps: int
    decode_steps_replayed: int  # ... that replayed a recorded window (Day 57)
    decode_steps_scattered: int  # ... that ran the eager forward
    decode_windows: str | None  # "cuda graphs over buckets [...]" or None
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache (Day 44)
    prefix_cache_hits: int  # ... found there
    prefix_cache_evictions: int  # cached blocks given up for new K/V
    recomputed_tokens: int  # tokens re-prefilled when preempted requests resumed
    forward_passes: int  # model forwards
    row_steps: int  # rows issued, summed over forwards (a static batch's bill)
    tokens_computed: int  # real token positions run through the model
    positions_computed: int  # positions the model ran, padding included (padded prefill)
    kv_cache_usage: float  # the KV manager's usage: blocks held / blocks, 0 to 1
    spec_decode: SpecDecodingStats | None = None  # speculative decoding's counters, when on
