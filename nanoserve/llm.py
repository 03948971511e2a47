"""``LLM``: the offline API, shaped like vLLM's.

Why this module exists: it is the front door. ``LLM(model_dir).generate(prompts, params)`` loads a
checkpoint, checks every input before any work starts, runs generation, and returns one
``RequestOutput`` per prompt with ``.token_ids``, ``.text`` and ``.finish_reason``.

Generation runs through the scheduler (``batching="continuous"``, Day 31): every iteration, the
scheduler releases the finished, grows the running and admits what fits, and the engine prefills
the admitted and decodes the running over the paged cache. A request leaves the batch at its own
last token. Blocks are bought a step at a time (``allocation="incremental"``, Day 33); when the
pool runs dry the youngest running request is preempted and later resumes by recompute, which
never changes its text. ``allocation="reserve"`` keeps Week 8's worst-case reservation.

The baselines stay available as policies, so each day's behaviour can be measured again:
``batching="static"`` (Day 29) runs waves of up to ``max_num_seqs`` requests until the wave's
last member is done, computing and holding every finished row until then; and
``enable_kv_cache=False`` (Day 4) recomputes the whole sequence for every token. ``stats`` and
each output's ``metrics`` and ``finish_iteration`` record what each way costs.

Since Day 36 the continuous path runs over the long-lived ``EngineCore`` (``core.py``): one
scheduler for the LLM's whole life, and ``generate`` adds its requests and steps the core until it
is drained, then asserts that every block and slot is back. The async engine and the server drive
the same core.

How a step is computed is chosen too (issue 12), each fast path beside the plain one it
replaces: ``prefill="packed"`` (default) or ``"padded"`` (Day 27); ``attention="gathered"``
(default, Day 50) or ``"reference"`` (Day 28's rectangle); ``compile=True`` for a decode
forward through ``torch.compile`` (Day 49; off by default, its warm-up in
``engine.compiled.warmup_s``, its graphs counted in ``engine.compiled.compiles``). ``dtype="auto"``
on a CPU is bfloat16 where the processor multiplies bf16 natively (AMX or AVX512-BF16) and
float32 elsewhere; ``llm.dtype`` and ``llm.dtype_reason`` say which, and so does a log line.
Logits reach the sampler in float32 either way. ``prepack="auto"`` reorders every linear weight
once, at load, into oneDNN's blocked layout when the model is bf16 on a CPU (bit-identical to
``F.linear`` there, and faster at decode sizes); ``llm.prepacked`` and ``llm.prepack_reason``
say what was chosen (``prepack.py``).

A reply ends by the first rule that fires, checked in this order after every token: an EOS id
(unless ``ignore_eos``), a ``stop_token_ids`` id, a ``stop`` string (the text is cut before it),
all "stop"; then the ``max_tokens`` budget, then the end of the context, both "length".
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import ModelConfig
from .core import EngineCore
from .engine import Engine
from .prepack import prepack_model
from .prepack import resolve as resolve_prepack
from .request import Request, RequestMetrics, RequestState
from .sampling import SamplingParams, sample_requests
from .scheduler import ALLOCATION_POLICIES
from .tokenizer import Tokenizer
from .weights import cpu_native_bf16, load_model

log = logging.getLogger("nanoserve")
DEFAULT_MODEL = Path(__file__).resolve().parent / "checkpoints" / "nanoserve-tiny"
DEFAULT_KV_BYTES = 1 << 30  # without num_kv_blocks, the pool is at most 1 GiB


def _dtype_reason(asked, got: torch.dtype, device: torch.device) -> str:
    if asked != "auto":
        return "as asked"
    if device.type != "cpu":
        return "the checkpoint's dtype"
    flag = cpu_native_bf16()
    return (f"this CPU multiplies bf16 natively ({flag})" if flag else
            "no native bf16 matmul on this CPU (no amx_bf16 / avx512_bf16 flag)")


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: int | str | None = None  # the token id or stop string that ended it
    metrics: RequestMetrics | None = None
    finish_iteration: int | None = None  # the iteration (1-based) that produced its last token
    num_preemptions: int = 0
    logprobs: list | None = None  # one TokenLogprob per token when params.logprobs is set

    @classmethod
    def of(cls, r: Request, prompt: str | None) -> RequestOutput:
        wanted = r.params is not None and r.params.logprobs is not None
        return cls(r.request_id, prompt, r.prompt_token_ids, r.output_token_ids, r.text,
                   r.finish_reason, r.stop_reason, r.metrics, r.finish_iteration,
                   r.num_preemptions, list(r.logprobs) if wanted else None)


@dataclass(slots=True)
class Stats:
    """What the engine did, counted: the numbers the chapters quote."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0  # useful tokens: the ones handed back
    iterations: int = 0  # steps that ran the model (a prefill and a decode may share one)
    forward_passes: int = 0  # model forwards
    row_steps: int = 0  # rows issued, summed over forwards (a static batch's bill)
    tokens_computed: int = 0  # real token positions run through the model
    positions_computed: int = 0  # positions the model ran, padding included (padded prefill)
    preemptions: int = 0  # running requests sent back to wait (incremental allocation)
    recomputed_tokens: int = 0  # tokens re-prefilled when preempted requests resumed
    decode_steps: int = 0  # batched decode forwards (Day 57)
    decode_steps_replayed: int = 0  # ... that replayed a recorded window
    decode_steps_scattered: int = 0  # ... that fell through to the eager forward

    @property
    def replay_share(self) -> float:
        """Replayed decode steps over all decode steps (0 when there were none)."""
        return self.decode_steps_replayed / self.decode_steps if self.decode_steps else 0.0


class LLM:
    def __init__(self, model: str | Path | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "cpu", max_model_len: int | None = None,
                 enable_kv_cache: bool = True, skip_tokenizer_init: bool = False,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 8, batching: str = "continuous",
                 allocation: str = "incremental", fail_on_step: tuple[int, ...] = (),
                 cuda_graphs: bool = False, compact_rows: bool | None = None,
                 prefill: str = "packed", attention: str = "gathered",
                 compile: bool | str = False, prepack: bool | str = "auto"):
        model_dir = Path(model) if model is not None else DEFAULT_MODEL
        if not model_dir.is_dir():
            raise ValueError(f"model folder {model_dir} does not exist")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available on this machine")
        for name, value in (("block_size", block_size), ("max_num_seqs", max_num_seqs)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if batching not in ("continuous", "static"):
            raise ValueError(f"batching={batching!r}; choose 'continuous' or 'static'")
        if allocation not in ALLOCATION_POLICIES:
            raise ValueError(f"allocation={allocation!r}; choose one of {ALLOCATION_POLICIES}")
        self.batching, self.max_num_seqs, self.allocation = batching, max_num_seqs, allocation
        # Day 57: decode through recorded windows; CUDA graphs on a card, eager replay of the
        # same windows without one (so it never raises on a CPU).
        self.cuda_graphs = bool(cuda_graphs)
        # The persistent batch (Day 58) follows the graphs unless told otherwise: a capture can
        # only replay steps whose rows are 0..n-1, and compaction is what keeps them there.
        self.compact_rows = self.cuda_graphs if compact_rows is None else bool(compact_rows)
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
        self.dtype = self.model.embed_tokens.weight.dtype  # what "auto" chose, said below
        self.dtype_reason = _dtype_reason(dtype, self.dtype, self.device)
        log.info("dtype=%s: %s (%s)", dtype, str(self.dtype).removeprefix("torch."),
                 self.dtype_reason)
        # Pre-packed oneDNN weights (prepack.py): bf16 on a CPU unless told otherwise.
        self.prepacked, self.prepack_reason = resolve_prepack(prepack, self.device, self.dtype,
                                                              compile)
        if self.prepacked:
            prepack_model(self.model)
        log.info("prepack=%s: %s (%s)", prepack, "packed" if self.prepacked else "plain",
                 self.prepack_reason)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else ()
        self.eos_token_ids = frozenset(eos or cfg.eos_token_ids)
        self.enable_kv_cache = enable_kv_cache
        if num_kv_blocks is None:
            per_block = 2 * cfg.num_hidden_layers * cfg.kv_size * block_size * \
                self.model.embed_tokens.weight.element_size()
            full = max_num_seqs * -(-self.max_model_len // block_size)
            num_kv_blocks = max(1, min(full, DEFAULT_KV_BYTES // per_block))
        self.engine = Engine(self.model, num_kv_blocks, block_size, max_num_seqs,
                             self.max_model_len, fail_on_step=frozenset(fail_on_step),
                             prefill=prefill, attention=attention, compile=compile,
                             cuda_graphs=self.cuda_graphs)
        self.core = EngineCore(self.engine, self.tokenizer, self.eos_token_ids,
                               self.max_model_len, cfg.vocab_size, max_num_seqs, allocation,
                               compact_rows=self.compact_rows)
        self.stats = Stats()

    # ---------------------------------------------------------------- input checks

    def _prompt_ids(self, i: int, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; this LLM was built with "
                                 "skip_tokenizer_init=True, so pass token ids")
            return prompt, self.tokenizer.encode(prompt)
        return None, [int(t) for t in prompt]

    def _admit(self, prompts, sampling_params) -> tuple[list[Request], list[str | None]]:
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
        encoded = [self._prompt_ids(i, p) for i, p in enumerate(prompts)]
        first = self.stats.requests
        reqs = [self.core.make_request(str(first + i), ids, sp, who=f"prompt {i}")
                for i, ((_, ids), sp) in enumerate(zip(encoded, sampling_params, strict=True))]
        self.stats.requests += len(reqs)
        self.stats.prompt_tokens += sum(len(t) for _, t in encoded)
        return reqs, [text for text, _ in encoded]

    # ---------------------------------------------------------------- generation

    def generate(self, prompts, sampling_params: SamplingParams | list | None = None
                 ) -> list[RequestOutput]:
        """Prompts as a list of strings or of token-id lists; one output per prompt."""
        reqs, texts = self._admit(prompts, sampling_params)
        e = self.engine
        before = (e.forward_passes, e.row_steps, e.tokens_computed, e.positions_computed)
        rc = e.replay_counters
        replay_before = (rc.decode_steps, rc.replayed)
        with torch.inference_mode():
            if not self.enable_kv_cache:
                for r in reqs:
                    self._run_uncached(r)
            elif self.batching == "static":
                self._run_static(reqs)
            else:
                self._run_continuous(reqs)
        self.stats.forward_passes += e.forward_passes - before[0]
        self.stats.row_steps += e.row_steps - before[1]
        self.stats.tokens_computed += e.tokens_computed - before[2]
        self.stats.positions_computed += e.positions_computed - before[3]
        steps, replayed = rc.decode_steps - replay_before[0], rc.replayed - replay_before[1]
        self.stats.decode_steps += steps
        self.stats.decode_steps_replayed += replayed
        self.stats.decode_steps_scattered += steps - replayed
        self.stats.generated_tokens += sum(len(r.output_token_ids) for r in reqs)
        self.core.check_drained()
        failed = [r for r in reqs if r.finish_reason == "error"]
        if failed:  # the offline API has no one to hand a half answer to: say so, loudly
            raise RuntimeError(f"{len(failed)} of {len(reqs)} requests failed: a forward raised "
                               f"during their step (every block is back in the pool)")
        return [RequestOutput.of(r, text) for r, text in zip(reqs, texts, strict=True)]

    def _run_continuous(self, reqs: list[Request], each_iteration=None) -> None:
        """Continuous batching (Day 31) over the engine core (Day 36): add every request, then
        step until the core is drained. ``each_iteration(scheduler, iteration)``, if given, runs
        before every step (the stress test aborts requests and checks invariants there)."""
        core, sched = self.core, self.core.scheduler
        before = (core.counters.iterations, sched.preemptions, sched.recomputed_tokens)
        for r in reqs:
            core.add(r)
        core.run_to_completion(each_iteration)
        for r in reqs:  # the iteration of this call that produced its last token (1-based)
            if r.finish_iteration is not None:
                r.finish_iteration -= before[0]
        self.stats.iterations += core.counters.iterations - before[0]
        self.stats.preemptions += sched.preemptions - before[1]
        self.stats.recomputed_tokens += sched.recomputed_tokens - before[2]

    def _next_wave(self, pending: deque[Request]) -> list[Request]:
        """Arrival order, up to max_num_seqs, while every member's worst case fits the pool."""
        pool, wave, need = self.engine.allocator, [], 0
        while pending and len(wave) < self.max_num_seqs:
            blocks = pool.blocks_for_length(pending[0].worst_case_tokens)
            if need + blocks > pool.num_free:
                break
            need += blocks
            wave.append(pending.popleft())
        return wave

    def _run_static(self, reqs: list[Request]) -> None:
        """Static batches (Day 29): a wave runs until its last member is done; finished rows
        are held (still computed, still holding blocks) and handed back at the wave's end."""
        e, pending, iteration = self.engine, deque(reqs), 0
        while pending:
            wave = self._next_wave(pending)
            rows = list(range(len(wave)))
            for row, r in zip(rows, wave, strict=True):
                r.slot = row
                r.transition(RequestState.RUNNING)
                e.grant(row, r.worst_case_tokens)
            try:
                logits = e.prefill(rows, [r.prompt_token_ids for r in wave])
                done = set()
                while True:
                    iteration += 1
                    for row, r, tok in zip(rows, wave, self._sample(logits, wave), strict=True):
                        if row in done:
                            continue
                        if r.append_token(tok):
                            done.add(row)
                            r.finish_iteration = iteration
                    if len(done) == len(wave):
                        break
                    last = [r.output_token_ids[-1] for r in wave]
                    logits = e.decode(rows, last, hold=frozenset(done))
            finally:
                for row in rows:
                    e.release(row)
            now = time.perf_counter()
            for r in wave:
                r.metrics.finished_time = now
        self.stats.iterations += iteration

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return sample_requests(logits, reqs)

    def _run_uncached(self, r: Request) -> None:
        """Day 4: no cache, one sequence, the whole sequence recomputed for each new token."""
        e, iteration = self.engine, 0
        r.transition(RequestState.RUNNING)
        while True:
            seq = r.token_ids
            x = torch.tensor([seq], device=self.device)  # (1, T)
            h = self.model(x, torch.arange(len(seq), device=self.device)[None])  # (1, T, E)
            e.forward_passes += 1
            e.row_steps += 1
            e.tokens_computed += len(seq)
            e.positions_computed += len(seq)
            iteration += 1
            tok = self._sample(self.model.compute_logits(h[:, -1]), [r])[0]
            if r.append_token(tok):
                break
        r.finish_iteration = iteration
        r.metrics.finished_time = time.perf_counter()
        self.stats.iterations += iteration
