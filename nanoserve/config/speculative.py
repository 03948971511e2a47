"""``SpeculativeConfig``: vLLM's ``speculative_config``, read once and checked at the door.

Why this module exists: speculative decoding (Days 76-78) is switched on by one JSON object, as
vLLM spells it (``--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'``), and
every front door (``LLM``, ``AsyncLLM``, ``nanoserve serve``, the benchmarks) must read it the
same way, with vLLM's defaults where a key is left out and a ``ValueError`` naming the key where a
value cannot be honoured. Two methods are built:

- ``ngram`` (prompt lookup): the longest suffix of the request's tokens, between
  ``prompt_lookup_min`` and ``prompt_lookup_max`` tokens long, found earlier in those tokens; the
  tokens that followed it are the proposal. Neither bound given: both are 5 (vLLM's default); one
  given: the other takes its value.
- ``draft_model``: a smaller checkpoint (``model``) proposes greedily or by sampling, one token
  at a time; its vocabulary must be the target's (checked when both are loaded).

>>> c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
>>> c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max
(3, 5, 5)
>>> SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3,
...                          "prompt_lookup_max": 4}).prompt_lookup_min
4
>>> SpeculativeConfig.parse({"method": "eagle", "num_speculative_tokens": 3})
Traceback (most recent call last):
ValueError: speculative_config: method='eagle' is not built; choose one of ('ngram', 'draft_model')
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

SPEC_METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16  # a verify step of more rows than this is never cheaper
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # k: proposals verified per step
    prompt_lookup_max: int | None = None  # ngram: the longest suffix looked up
    prompt_lookup_min: int | None = None  # ngram: the shortest
    model: str | None = None  # draft_model: the draft checkpoint's folder

    @classmethod
    def parse(cls, value) -> SpeculativeConfig:
        """A JSON string, a dict or a ``SpeculativeConfig`` -> a checked ``SpeculativeConfig``
        with vLLM's defaults filled in; a ``ValueError`` naming the key otherwise."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config: unknown key {unknown[0]!r}; the keys built "
                             f"are {_KEYS}")
        method = value.get("method")
        if method not in SPEC_METHODS:
            raise ValueError(f"speculative_config: method={method!r} is not built; choose one "
                             f"of {SPEC_METHODS}")
        k = value.get("num_speculative_tokens")
        _check_int("num_speculative_tokens", k, 1, MAX_SPECULATIVE_TOKENS)
        lo, hi, model = (value.get("prompt_lookup_min"), value.get("prompt_lookup_max"),
                         value.get("model"))
        if method == "ngram":
            if model is not None:
                raise ValueError("speculative_config: method='ngram' takes no 'model'")
            lo, hi = (5, 5) if lo is None and hi is None else (lo or hi, hi or lo)
            _check_int("prompt_lookup_min", lo, 1, None)
            _check_int("prompt_lookup_max", hi, 1, None)
            if lo > hi:
                raise ValueError(f"speculative_config: prompt_lookup_min={lo} is above "
                                 f"prompt_lookup_max={hi}")
        else:
            if lo is not None or hi is not None:
                raise ValueError("speculative_config: prompt_lookup_min/max are ngram's keys; "
                                 "method='draft_model' takes 'model'")
            if not isinstance(model, (str, Path)) or not Path(model).is_dir():
                raise ValueError(f"speculative_config: method='draft_model' needs 'model', a "
                                 f"checkpoint folder that exists; got {model!r}")
            model = str(model)
        return cls(method, k, hi, lo, model)

    def to_json(self) -> str:
        """The JSON vLLM's ``--speculative-config`` takes for the same settings."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})


def _check_int(name: str, value, lo: int, hi: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"speculative_config: {name} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"speculative_config: {name} must be {bound}, got {value}")
