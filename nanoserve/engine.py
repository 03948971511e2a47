"""``LLM``: the offline API, shaped like vLLM's.

Why this module exists: it is the front door. ``LLM(model_dir).generate(prompts, params)`` loads a
checkpoint, checks every input before any work starts, runs generation, and returns one
``RequestOutput`` per prompt with ``.token_ids``, ``.text`` and ``.finish_reason``.

At this stage generation runs one sequence at a time over the contiguous KV cache (Day 7), or with
no cache at all (Day 4's baseline, ``enable_kv_cache=False``), which recomputes the whole sequence
for every token. Batching arrives with the paged cache.

A reply ends by the first rule that fires, checked in this order after every token: an EOS id
(unless ``ignore_eos``), a ``stop_token_ids`` id, a ``stop`` string (the text is cut before it),
all "stop"; then the ``max_tokens`` budget, then the end of the context, both "length".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import ModelConfig
from .kv_cache import KVCache
from .sampling import SamplingParams, sample
from .tokenizer import IncrementalDetokenizer, Tokenizer
from .weights import load_model

DEFAULT_MODEL = Path(__file__).resolve().parent / "checkpoints" / "nanoserve-tiny"


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: int | str | None = None  # the token id or stop string that ended it


@dataclass(slots=True)
class Stats:
    """What the engine did, counted: the numbers the chapters quote."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    forward_calls: int = 0
    tokens_computed: int = 0  # token positions run through the model, over all forwards


class LLM:
    def __init__(self, model: str | Path | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "cpu", max_model_len: int | None = None,
                 enable_kv_cache: bool = True, skip_tokenizer_init: bool = False):
        model_dir = Path(model) if model is not None else DEFAULT_MODEL
        if not model_dir.is_dir():
            raise ValueError(f"model folder {model_dir} does not exist")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available on this machine")
        self.config = ModelConfig.from_dir(model_dir)
        self.model = load_model(model_dir, dtype, device)
        self.device = torch.device(device)
        limit = self.config.max_position_embeddings
        if max_model_len is not None and not 1 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [2, {limit}] "
                             f"(max_position_embeddings), got {max_model_len}")
        self.max_model_len = max_model_len or limit
        self.enable_kv_cache = enable_kv_cache
        self.tokenizer = None if skip_tokenizer_init else Tokenizer.from_dir(model_dir)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else ()
        self.eos_token_ids = frozenset(eos or self.config.eos_token_ids)
        self.stats = Stats()

    # ---------------------------------------------------------------- input checks

    def _prompt_ids(self, i: int, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; this LLM was built with "
                                 "skip_tokenizer_init=True, so pass token ids")
            text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, ids = None, [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        V = self.config.vocab_size
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt {i}: token id {bad[0]} is outside the vocabulary "
                             f"(vocab_size={V})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; max_model_len is "
                             f"{self.max_model_len} and generation needs one free position")
        return text, ids

    def _normalise(self, prompts, sampling_params):
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts is empty")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} "
                             f"SamplingParams")
        for sp in sampling_params:
            sp.check_vocab(self.config.vocab_size)
        return [self._prompt_ids(i, p) for i, p in enumerate(prompts)], sampling_params

    # ---------------------------------------------------------------- generation

    def generate(self, prompts, sampling_params: SamplingParams | list | None = None
                 ) -> list[RequestOutput]:
        """Prompts as a list of strings or of token-id lists; one output per prompt."""
        encoded, params = self._normalise(prompts, sampling_params)
        outputs = []
        for (text, ids), sp in zip(encoded, params, strict=True):
            out = RequestOutput(self.stats.requests, text, ids)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(ids)
            with torch.inference_mode():
                self._run(out, sp)
            outputs.append(out)
        return outputs

    def _forward_last(self, ids: list[int], start: int, cache: KVCache | None) -> torch.Tensor:
        """Run ``ids`` (at positions start..) and return the last position's logits (V,)."""
        x = torch.tensor([ids], device=self.device)  # (1, T)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]  # (1, T)
        h = self.model(x, pos, cache)  # (1, T, E)
        if cache is not None:
            cache.advance(len(ids))
        self.stats.forward_calls += 1
        self.stats.tokens_computed += len(ids)
        return self.model.compute_logits(h[0, -1])

    def _run(self, out: RequestOutput, sp: SamplingParams) -> None:
        prompt = out.prompt_token_ids
        budget = self.max_model_len - len(prompt)
        if sp.max_tokens is not None:
            budget = min(budget, sp.max_tokens)
        cache = (KVCache.for_model(self.model, 1, len(prompt) + budget)
                 if self.enable_kv_cache else None)
        detok = (IncrementalDetokenizer(self.tokenizer, prompt, sp.skip_special_tokens)
                 if self.tokenizer else None)
        gen = sp.make_generator(self.device)
        logits = self._forward_last(prompt, 0, cache)
        while True:
            token = int(sample(logits[None], [sp], [gen])[0])
            out.token_ids.append(token)
            self.stats.generated_tokens += 1
            delta = detok.push(token) if detok is not None else ""
            if self._finished(out, sp, token, detok, delta):
                break
            seq = out.prompt_token_ids + out.token_ids
            logits = (self._forward_last([token], len(seq) - 1, cache) if cache is not None
                      else self._forward_last(seq, 0, None))
        if detok is not None and not isinstance(out.stop_reason, str):
            out.text = detok.text

    def _finished(self, out: RequestOutput, sp: SamplingParams, token: int,
                  detok: IncrementalDetokenizer | None, delta: str) -> bool:
        """The stop rules, in order; sets finish_reason, stop_reason and (for strings) text."""
        if token in self.eos_token_ids and not sp.ignore_eos:
            out.finish_reason, out.stop_reason = "stop", token
        elif token in sp.stop_token_ids:
            out.finish_reason, out.stop_reason = "stop", token
        elif detok is not None and sp.stop:
            for s in sp.stop:
                # a new match must end inside the delta: search only that tail
                cut = detok.text.find(s, max(0, len(detok.text) - len(delta) - len(s) + 1))
                if cut >= 0:
                    out.finish_reason, out.stop_reason, out.text = "stop", s, detok.text[:cut]
                    return True
        if out.finish_reason is None:
            n = len(out.token_ids)
            if sp.max_tokens is not None and n >= sp.max_tokens:
                out.finish_reason = "length"
            elif len(out.prompt_token_ids) + n >= self.max_model_len:
                out.finish_reason = "length"
        return out.finish_reason is not None
