"""``LLM``: the offline API, shaped like vLLM's.

Why this module exists: it is the front door. ``LLM(model_dir).generate(prompts, params)`` loads a
checkpoint, checks every input before any work starts, runs generation, and returns one
``RequestOutput`` per prompt with ``.token_ids``, ``.text`` and ``.finish_reason``.

Generation runs as *static batches* (Day 29) over the paged cache: up to ``max_num_seqs``
requests form a wave, one padded prefill starts them all, and batched decode steps run until the
wave's last request is done. A request that finishes early stays in the rectangle until then: its
row keeps being computed, and its answer is handed back only when the wave ends. Those two bills,
the wasted row-steps and the head-of-line wait, are what ``stats`` and each output's ``metrics``
record, and what the scheduler removes. ``enable_kv_cache=False`` keeps Day 4's baseline: one
sequence at a time, the whole sequence recomputed for every token.

A reply ends by the first rule that fires, checked in this order after every token: an EOS id
(unless ``ignore_eos``), a ``stop_token_ids`` id, a ``stop`` string (the text is cut before it),
all "stop"; then the ``max_tokens`` budget, then the end of the context, both "length".
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import ModelConfig
from .engine import Engine
from .sampling import SamplingParams, sample
from .tokenizer import IncrementalDetokenizer, Tokenizer
from .weights import load_model

DEFAULT_MODEL = Path(__file__).resolve().parent / "checkpoints" / "nanoserve-tiny"
DEFAULT_KV_BYTES = 1 << 30  # without num_kv_blocks, the pool is at most 1 GiB


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.perf_counter) of one request's life, as vLLM names them."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None  # its own last token was sampled
    finished_time: float | None = None  # its answer was handed back


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: int | str | None = None  # the token id or stop string that ended it
    metrics: RequestMetrics | None = None
    finish_iteration: int | None = None  # the forward pass (1-based, per wave) of its last token

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class Stats:
    """What the engine did, counted: the numbers the chapters quote."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0  # useful tokens: the ones handed back
    forward_passes: int = 0
    row_steps: int = 0  # rows issued, summed over forward passes (a static batch's bill)
    tokens_computed: int = 0  # real token positions run through the model


class _Sequence:
    """One request in flight: its output, its sampling state, and the stop rules."""

    def __init__(self, out: RequestOutput, params: SamplingParams, llm: LLM):
        self.out, self.params = out, params
        self.eos = frozenset() if params.ignore_eos else llm.eos_token_ids
        self.max_model_len = llm.max_model_len
        self.budget = llm.max_model_len - len(out.prompt_token_ids)
        if params.max_tokens is not None:
            self.budget = min(self.budget, params.max_tokens)
        self.generator = params.make_generator(llm.device)
        self.detok = (IncrementalDetokenizer(llm.tokenizer, out.prompt_token_ids,
                                             params.skip_special_tokens)
                      if llm.tokenizer else None)

    @property
    def worst_case_tokens(self) -> int:
        return len(self.out.prompt_token_ids) + self.budget

    def append(self, token: int, now: float) -> bool:
        """Record one sampled token and apply the stop rules; True when the request is done."""
        out, sp = self.out, self.params
        out.token_ids.append(token)
        out.metrics.first_token_time = out.metrics.first_token_time or now
        out.metrics.last_token_time = now
        delta = self.detok.push(token) if self.detok is not None else ""
        if token in self.eos or token in sp.stop_token_ids:
            out.finish_reason, out.stop_reason = "stop", token
        elif self.detok is not None and sp.stop and delta:
            text = self.detok.text
            # a new match must end inside the delta, so search only that tail; the earliest wins
            hits = [(text.find(s, max(0, len(text) - len(delta) - len(s) + 1)), s)
                    for s in sp.stop]
            hits = [(cut, s) for cut, s in hits if cut >= 0]
            if hits:
                cut, s = min(hits)
                out.finish_reason, out.stop_reason, out.text = "stop", s, text[:cut]
                return True
        if out.finish_reason is None and len(out.token_ids) >= self.budget:
            out.finish_reason = "length"
        if out.finish_reason is not None and self.detok is not None:
            out.text = self.detok.text
        return out.finish_reason is not None


class LLM:
    def __init__(self, model: str | Path | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "cpu", max_model_len: int | None = None,
                 enable_kv_cache: bool = True, skip_tokenizer_init: bool = False,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 8):
        model_dir = Path(model) if model is not None else DEFAULT_MODEL
        if not model_dir.is_dir():
            raise ValueError(f"model folder {model_dir} does not exist")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available on this machine")
        for name, value in (("block_size", block_size), ("max_num_seqs", max_num_seqs)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_kv_blocks is not None and num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_kv_blocks}")
        self.config = cfg = ModelConfig.from_dir(model_dir)
        limit = cfg.max_position_embeddings
        if max_model_len is not None and not 1 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [2, {limit}] "
                             f"(max_position_embeddings), got {max_model_len}")
        self.max_model_len = max_model_len or limit
        self.tokenizer = None if skip_tokenizer_init else Tokenizer.from_dir(model_dir)
        self.model = load_model(model_dir, dtype, device)
        self.device = torch.device(device)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else ()
        self.eos_token_ids = frozenset(eos or cfg.eos_token_ids)
        self.enable_kv_cache = enable_kv_cache
        if num_kv_blocks is None:
            per_block = 2 * cfg.num_hidden_layers * cfg.kv_size * block_size * \
                self.model.embed_tokens.weight.element_size()
            full = max_num_seqs * -(-self.max_model_len // block_size)
            num_kv_blocks = max(1, min(full, DEFAULT_KV_BYTES // per_block))
        self.engine = Engine(self.model, num_kv_blocks, block_size, max_num_seqs,
                             self.max_model_len)
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

    def _admit(self, prompts, sampling_params) -> list[_Sequence]:
        """Validate everything first: a bad request anywhere means no work starts."""
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
        encoded = [self._prompt_ids(i, p) for i, p in enumerate(prompts)]
        now = time.perf_counter()
        seqs = []
        for (text, ids), sp in zip(encoded, sampling_params, strict=True):
            out = RequestOutput(self.stats.requests + len(seqs), text, ids,
                                metrics=RequestMetrics(now))
            seqs.append(_Sequence(out, sp, self))
        pool = self.engine.allocator
        for i, s in enumerate(seqs):
            need = pool.blocks_for_length(s.worst_case_tokens)
            if need > pool.num_blocks:
                raise ValueError(f"prompt {i}: prompt + max_tokens = {s.worst_case_tokens} "
                                 f"tokens need {need} KV blocks; the pool has "
                                 f"{pool.num_blocks} (raise num_kv_blocks or lower max_tokens)")
        self.stats.requests += len(seqs)
        self.stats.prompt_tokens += sum(len(t) for _, t in encoded)
        return seqs

    # ---------------------------------------------------------------- generation

    def generate(self, prompts, sampling_params: SamplingParams | list | None = None
                 ) -> list[RequestOutput]:
        """Prompts as a list of strings or of token-id lists; one output per prompt."""
        seqs = self._admit(prompts, sampling_params)
        e = self.engine
        before = (e.forward_passes, e.row_steps, e.tokens_computed)
        with torch.inference_mode():
            if self.enable_kv_cache:
                self._run_static(seqs)
            else:
                for s in seqs:
                    self._run_uncached(s)
        self.stats.forward_passes += e.forward_passes - before[0]
        self.stats.row_steps += e.row_steps - before[1]
        self.stats.tokens_computed += e.tokens_computed - before[2]
        self.stats.generated_tokens += sum(len(s.out.token_ids) for s in seqs)
        assert e.allocator.num_free == e.allocator.num_blocks, "a KV block leaked"
        return [s.out for s in seqs]

    def _sample(self, logits: torch.Tensor, seqs: list[_Sequence]) -> list[int]:
        return sample(logits, [s.params for s in seqs], [s.generator for s in seqs]).tolist()

    def _next_wave(self, pending: deque[_Sequence]) -> list[_Sequence]:
        """Arrival order, up to max_num_seqs, while every member's worst case fits the pool."""
        pool, wave, need = self.engine.allocator, [], 0
        while pending and len(wave) < len(self.engine.cache.tables):
            blocks = pool.blocks_for_length(pending[0].worst_case_tokens)
            if need + blocks > pool.num_free:
                break
            need += blocks
            wave.append(pending.popleft())
        return wave

    def _run_static(self, seqs: list[_Sequence]) -> None:
        e, pending = self.engine, deque(seqs)
        while pending:
            wave = self._next_wave(pending)
            rows = list(range(len(wave)))
            for row, s in zip(rows, wave, strict=True):
                e.grant(row, s.worst_case_tokens)
            try:
                logits = e.prefill(rows, [s.out.prompt_token_ids for s in wave])
                iteration, done = 1, set()
                while True:
                    now = time.perf_counter()
                    for row, s, tok in zip(rows, wave, self._sample(logits, wave), strict=True):
                        if row not in done and s.append(tok, now):
                            done.add(row)
                            s.out.finish_iteration = iteration
                    if len(done) == len(wave):
                        break
                    last = [s.out.token_ids[-1] for s in wave]
                    logits = e.decode(rows, last, hold=frozenset(done))
                    iteration += 1
            finally:
                for row in rows:
                    e.release(row)
            now = time.perf_counter()
            for s in wave:
                s.out.metrics.finished_time = now

    def _run_uncached(self, s: _Sequence) -> None:
        """Day 4: no cache, one sequence, the whole sequence recomputed for each new token."""
        e, seq = self.engine, list(s.out.prompt_token_ids)
        iteration = 0
        while True:
            x = torch.tensor([seq], device=self.device)  # (1, T)
            h = self.model(x, torch.arange(len(seq), device=self.device)[None])  # (1, T, E)
            e.forward_passes += 1
            e.row_steps += 1
            e.tokens_computed += len(seq)
            iteration += 1
            tok = self._sample(self.model.compute_logits(h[:, -1]), [s])[0]
            if s.append(tok, time.perf_counter()):
                break
            seq.append(tok)
        s.out.finish_iteration = iteration
        s.out.metrics.finished_time = time.perf_counter()
