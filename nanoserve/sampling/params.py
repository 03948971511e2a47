"""``SamplingParams``: one request's decoding rules, with vLLM's names, defaults and meaning.

Why this module exists: every request carries its own rules, and each is checked once, at the
door, so a bad value is an ``InvalidRequest`` (a ``ValueError`` that carries the field as
``param``) rather than a NaN three layers down. The sampler (``sampler.py``) applies them.

``logit_bias`` takes OpenAI's map from token id to a bias added to that token's logit, its keys
ints or the strings OpenAI's JSON carries, each value clamped to [-100, 100] as vLLM's
``SamplingParams.from_optional`` does; ``check_vocab`` refuses an id outside the vocabulary, as
vLLM's ``_validate_logit_bias`` does. ``prompt_logprobs`` is vLLM's: the logprob of every prompt
token after the first and the top k there, under the raw model; -1 means the whole vocabulary,
which, as in vLLM, must fit under the cap of ``MAX_LOGPROBS`` (so it is refused for any real
vocabulary).

>>> SamplingParams(temperature=0).greedy
True
>>> SamplingParams(top_p=0)
Traceback (most recent call last):
nanoserve.validation.InvalidRequest: top_p must be in (0, 1], got 0
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from nanoserve.structured.params import StructuredOutputsParams
from nanoserve.validation import InvalidRequest

INT32_MAX = 2**31 - 1
SAMPLING_EPS = 1e-5  # temperatures below this are greedy; dividing by them overflows
MAX_LOGPROBS = 20  # the most top alternatives a request may ask for (OpenAI's limit)


def _check_float(name: str, value: float, lo: float, hi: float, interval: str) -> None:
    """Refuse non-numbers, NaN and infinities, then anything outside ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name} must be a float, got {value!r}", name, value)
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidRequest(f"{name} must be in {interval}, got {value}", name, value)


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an int, got {value!r}", name, value)


def _logit_bias(bias) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` as ``{token id: bias}``: string keys read as ints, values
    clamped to [-100, 100] (vLLM's and OpenAI's range); NaN and non-numbers refused.

    >>> _logit_bias({"5": 200, 7: -3})
    {5: 100.0, 7: -3.0}
    """
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise InvalidRequest(f"logit_bias must map token ids to biases, got "
                             f"{type(bias).__name__}", "logit_bias")
    out = {}
    for key, value in bias.items():
        try:
            if isinstance(key, bool) or isinstance(key, float):
                raise ValueError
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"logit_bias: key {key!r} is not a token id (an integer, or a "
                                 f"string holding one)", "logit_bias", key) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InvalidRequest(f"logit_bias[{key!r}] must be a number, got {value!r}",
                                 "logit_bias", value)
        out[token] = min(100.0, max(-100.0, float(value)))
    return out or None


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
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # 0: off
    frequency_penalty: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    min_tokens: int = 0  # EOS and stop rules wait until the output has this many tokens
    logprobs: int | None = None  # None: off; k: the sampled token's logprob and the top k
    structured_outputs: StructuredOutputsParams | dict | None = None  # a grammar (Day 67)
    logit_bias: dict[int, float] | None = None  # token id -> bias added to its logit
    prompt_logprobs: int | None = None  # None: off; k: each prompt token's logprob and top k

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also catches NaN
            raise InvalidRequest(f"temperature must be >= 0 (0 = greedy), got {self.temperature}",
                                 "temperature", self.temperature)
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}", "top_p", self.top_p)
        if not -1 <= self.top_k <= INT32_MAX:  # larger than any vocabulary; and it must fit
            raise InvalidRequest(f"top_k must be -1, 0 (off) or in [1, {INT32_MAX}], "
                                 f"got {self.top_k}", "top_k", self.top_k)
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise InvalidRequest(f"seed must be a 64-bit integer, got {self.seed}", "seed",
                                 self.seed)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens",
                                 self.max_tokens)
        _check_float("min_p", self.min_p, 0.0, 1.0, "[0, 1]")
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0, "[-2, 2]")
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "[-2, 2]")
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, math.inf, "(0, inf)")
        if self.repetition_penalty <= 0:
            raise InvalidRequest(f"repetition_penalty must be > 0, got {self.repetition_penalty}",
                                 "repetition_penalty", self.repetition_penalty)
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise InvalidRequest(f"min_tokens must be >= 0, got {self.min_tokens}", "min_tokens",
                                 self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequest(f"min_tokens must be <= max_tokens={self.max_tokens}, "
                                 f"got {self.min_tokens}", "min_tokens", self.min_tokens)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise InvalidRequest(f"logprobs must be None or in [0, {MAX_LOGPROBS}], "
                                     f"got {self.logprobs}", "logprobs", self.logprobs)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs)
            if not -1 <= self.prompt_logprobs <= MAX_LOGPROBS:
                raise InvalidRequest(f"prompt_logprobs must be None, -1 (the whole vocabulary) or "
                                     f"in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}",
                                     "prompt_logprobs", self.prompt_logprobs)
        self.logit_bias = _logit_bias(self.logit_bias)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty", "stop")
        self.stop_token_ids = list(self.stop_token_ids or [])
        so = self.structured_outputs
        if isinstance(so, dict):
            try:
                so = StructuredOutputsParams(**so)
            except TypeError as e:
                raise InvalidRequest(f"structured_outputs: {e}", "structured_outputs") from None
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise InvalidRequest(f"structured_outputs must be a StructuredOutputsParams, got "
                                 f"{type(so).__name__}", "structured_outputs")
        self.structured_outputs = so

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def num_prompt_logprobs(self) -> int | None:
        """``prompt_logprobs`` with -1 read as "all": the top count to ask for (None: off)."""
        return None if self.prompt_logprobs is None else (
            INT32_MAX if self.prompt_logprobs == -1 else self.prompt_logprobs)

    @property
    def penalised(self) -> bool:
        """Does any penalty change the logits? (All three off is the common, free case.)"""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    def check_vocab(self, vocab_size: int) -> None:
        for t in self.stop_token_ids:
            if not 0 <= t < vocab_size:
                raise InvalidRequest(f"stop_token_ids: token id {t} is outside the vocabulary "
                                     f"(vocab_size={vocab_size})", "stop_token_ids", t)
        bad = sorted(t for t in self.logit_bias or () if not 0 <= t < vocab_size)
        if bad:
            raise InvalidRequest(f"logit_bias: token id(s) {bad} are outside the vocabulary "
                                 f"(vocab_size={vocab_size})", "logit_bias", bad)
        if self.prompt_logprobs == -1 and vocab_size > MAX_LOGPROBS:  # vLLM's rule for -1
            raise InvalidRequest(f"prompt_logprobs=-1 asks for all {vocab_size} tokens at every "
                                 f"prompt position, over the limit of {MAX_LOGPROBS}",
                                 "prompt_logprobs", -1)

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A per-request generator, so a seeded request draws the same tokens in any batch."""
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8)) >> 1
        g.manual_seed(seed)  # never touches the global RNG
        return g
