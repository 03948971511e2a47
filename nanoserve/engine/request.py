"""Requests as objects with a lifecycle, not as positions in a batch.

Why this module exists: in a static batch a request *is* its row, so it cannot leave before the
batch does. Here a request is an object with a lifecycle (waiting, running, finished); it keeps
its prompt, the tokens generated so far, the batch row it was given and the KV blocks it has.
The lifecycle is written as data, ``_LEGAL_TRANSITIONS``: the edges in the table are the only
moves the engine can make, and any other, including a self-transition, raises
``IllegalTransition`` instead of corrupting bookkeeping quietly.

``append_token`` applies the stop rules in a fixed order: EOS (and ``stop_token_ids``, and
``stop`` strings when a detokenizer is attached) first, then the budget. So a request whose last
budgeted token is EOS finishes with "stop", not "length". While the output is shorter than
``min_tokens`` the stop rules are silent (vLLM's rule; the sampler masks EOS meanwhile), but the
budget is not.

>>> r = Request(0, [1, 2, 3], max_tokens=2)
>>> r.transition(RequestState.RUNNING); r.append_token(7), r.append_token(8)
(False, True)
>>> r.state, r.finish_reason
(<RequestState.FINISHED: 'finished'>, 'length')
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from nanoserve.sampling.sampler import TokenLogprob
    from nanoserve.tokenizer import IncrementalDetokenizer


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_LEGAL_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.RUNNING, RequestState.FINISHED}),  # admit, abort
    RequestState.RUNNING: frozenset({RequestState.FINISHED,  # stop, length, abort
                                     RequestState.WAITING}),  # preempt (Day 33)
    RequestState.FINISHED: frozenset(),
}


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.perf_counter) of one request's life, as vLLM names them."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None  # its own last token was sampled
    finished_time: float | None = None  # its answer was handed back


class IllegalTransition(RuntimeError):
    """An edge that is not in ``_LEGAL_TRANSITIONS``: a bug in the caller, never a no-op."""


class Request:
    def __init__(self, request_id: int | str, prompt_token_ids: list[int], max_tokens: int,
                 eos_token_ids: frozenset[int] = frozenset(),
                 stop_token_ids: frozenset[int] = frozenset(), stop: tuple[str, ...] = (),
                 detokenizer: IncrementalDetokenizer | None = None,
                 generator: torch.Generator | None = None, params=None,
                 min_tokens: int | None = None):
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: empty prompt")
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: max_tokens must be >= 1, got {max_tokens}")
        if min_tokens is None:  # by default the SamplingParams' own, so sampler and stop agree
            min_tokens = getattr(params, "min_tokens", 0)
        if min_tokens < 0:
            raise ValueError(f"request {request_id}: min_tokens must be >= 0, got {min_tokens}")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.eos_token_ids = eos_token_ids
        self.stop_token_ids = stop_token_ids
        self.stop = stop
        self.detokenizer = detokenizer
        self.generator = generator
        self.params = params  # the SamplingParams the sampler reads
        self.min_tokens = min_tokens  # stop rules wait until the output has this many tokens
        self.logprobs: list[TokenLogprob] = []  # one per output token when params.logprobs
        # params.prompt_logprobs: one per prompt token after the first, filled as the prefill's
        # chunks compute them (engine/prompt_logprobs.py)
        self.prompt_logprobs: list[TokenLogprob] = []
        self.state = RequestState.WAITING
        self.slot: int | None = None  # the batch row it occupies while running
        self.blocks: list[int] = []  # the KV blocks it holds
        self.num_computed_tokens = 0  # tokens whose K/V is cached (scheduled counts as done)
        self.block_hashes: list[bytes] = []  # chained hashes of its full blocks (Day 43)
        self.num_cached_blocks = 0  # of its blocks, those the prefix cache can find
        self.num_null_blocks = 0  # its first blocks, placeholders: behind a window (Day 70)
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: int | str | None = None
        self.text = ""
        self.metrics: RequestMetrics | None = None
        self.finish_iteration: int | None = None  # the iteration that produced its last token
        self.arrival = 0  # order of arrival at the scheduler: lower is older
        self.num_preemptions = 0
        self.matcher = None  # structured outputs: the grammar's state after output_token_ids
        # Speculative decoding (Day 76): the tokens proposed to follow output_token_ids, which
        # the next step verifies, and the draft's probabilities for them ((k, V); None: an
        # n-gram proposal, certain). Cut by the scheduler to what the step's budget holds.
        self.spec_token_ids: list[int] = []
        self.spec_draft_probs = None

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.state.value}, slot={self.slot}, "
                f"blocks={len(self.blocks)}, tokens={len(self.output_token_ids)})")

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output: what the cache must hold to continue this request."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def worst_case_tokens(self) -> int:
        """The prompt plus every token it may still emit: what Week 8 reserves at admission."""
        return len(self.prompt_token_ids) + self.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def transition(self, new: RequestState) -> None:
        if new not in _LEGAL_TRANSITIONS[self.state]:
            raise IllegalTransition(f"request {self.request_id!r}: {self.state.value} -> "
                                    f"{new.value} is not a legal transition")
        self.state = new

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.transition(RequestState.FINISHED)
        self.finish_reason, self.stop_reason = reason, stop_reason

    def append_token(self, token: int) -> bool:
        """Record one generated token; apply the stop rules in order. True when finished."""
        if self.state is not RequestState.RUNNING:
            raise IllegalTransition(f"request {self.request_id!r} is {self.state.value}; "
                                    f"only a running request takes tokens")
        self.output_token_ids.append(token)
        if self.metrics is not None:
            now = time.perf_counter()
            self.metrics.first_token_time = self.metrics.first_token_time or now
            self.metrics.last_token_time = now
        delta = self.detokenizer.push(token) if self.detokenizer is not None else ""
        if self.matcher is not None:
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"request {self.request_id!r}: token {token} is outside its "
                                   f"grammar ({self.matcher.get_error()}); the mask let it through")
            if self.matcher.is_stopped():  # the grammar is complete: nothing more may follow
                self.finish("stop", token if token in self.eos_token_ids else None)
                if self.detokenizer is not None:
                    self.text = self.detokenizer.text
                return True
        if len(self.output_token_ids) < self.min_tokens:
            pass  # too short to stop (vLLM's rule); from the min_tokens-th token on, it may
        elif token in self.eos_token_ids or token in self.stop_token_ids:
            self.finish("stop", token)
        elif self.stop and delta:
            text = self.detokenizer.text
            # a new match must end inside the delta: search that tail; the earliest match wins
            hits = [(text.find(s, max(0, len(text) - len(delta) - len(s) + 1)), s)
                    for s in self.stop]
            hits = [h for h in hits if h[0] >= 0]
            if hits:
                cut, s = min(hits)
                self.finish("stop", s)
                self.text = text[:cut]
                return True
        if not self.is_finished and len(self.output_token_ids) >= self.max_tokens:
            self.finish("length")
        if self.is_finished and self.detokenizer is not None:
            self.text = self.detokenizer.text
        return self.is_finished
