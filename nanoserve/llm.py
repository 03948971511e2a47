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

The baselines stay available as policies of the same core, so each day's behaviour can be
measured again: ``batching="static"`` (Day 29, ``engine/waves.py``) runs waves of up to
``max_num_seqs`` requests until the wave's last member is done, computing and holding every
finished row until then; and ``enable_kv_cache=False`` (Day 4) recomputes the whole sequence for
every token. ``stats`` and each output's ``metrics`` and ``finish_iteration`` record what each way
costs.

Every path runs over the long-lived ``EngineCore`` (Day 36, ``engine/core.py``): one scheduler for
the LLM's whole life, and ``generate`` adds its requests and steps the core until it is drained,
then asserts that every block and slot is back. It reaches the core through its public methods
and its ``snapshot()`` only. ``AsyncLLM`` is this class's sibling over its own core; both take the
options of ``EngineConfig`` (``config/engine.py``), which holds every default and every check.

How a step is computed is chosen too, each fast path beside the plain one it replaces:
``prefill="packed"`` (default) or ``"padded"`` (Day 27); ``attention="cpu"`` (Day 55's C++ kernel,
what ``"auto"`` picks where the C++ ops load), ``"gathered"`` (Day 50, auto's choice elsewhere) or
``"reference"`` (Day 28's rectangle); ``kernels="auto"`` runs the forward through the C++ CPU ops
(Day 54, ``cpu/fused.py``), and ``llm.kernels`` and ``llm.kernels_reason`` say whether and why;
``compile=True`` for a decode forward through ``torch.compile`` (Day 49; off by default, its
warm-up in ``engine.compiled.warmup_s``, its graphs counted in ``engine.compiled.compiles``).
``dtype="auto"`` on a CPU is whichever of bfloat16 and float32 runs the model's linears faster
on this processor, timed once at load and cached per CPU model (``cpu/auto_dtype.py``);
``llm.dtype`` and ``llm.dtype_reason`` say which and quote the measurement, and so does a log
line. Logits reach the sampler in float32 either way. ``prepack="auto"`` reorders every linear
weight once, at load, into oneDNN's blocked layout when the model is bf16 on a CPU (bit-identical
to ``F.linear`` there, and faster at decode sizes), and in float32 where a measurement at load
found it faster than ``F.linear``; ``llm.prepacked`` and ``llm.prepack_reason`` say what was
chosen and why (``layers/linear_methods.py``).

A reply ends by the first rule that fires, checked in this order after every token: an EOS id
(unless ``ignore_eos``), a ``stop_token_ids`` id, a ``stop`` string (the text is cut before it),
all "stop"; then the ``max_tokens`` budget, then the end of the context, both "length".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from nanoserve.config import DEFAULT_MODEL, EngineConfig
from nanoserve.cpu.threads import pinned
from nanoserve.engine.outputs import CoreSnapshot
from nanoserve.engine.request import Request, RequestMetrics
from nanoserve.loader import load_core
from nanoserve.sampling.params import SamplingParams
from nanoserve.validation import InvalidRequest

__all__ = ["DEFAULT_MODEL", "LLM", "RequestOutput", "Stats"]


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
    # params.prompt_logprobs, as vLLM: None for the first prompt token (nothing precedes it),
    # then one TokenLogprob per prompt token under the raw model
    prompt_logprobs: list | None = None

    @classmethod
    def of(cls, r: Request, prompt: str | None) -> RequestOutput:
        sp = r.params
        wanted = sp is not None and sp.logprobs is not None
        prompt_lp = None if sp is None or sp.prompt_logprobs is None else \
            [None, *r.prompt_logprobs]
        return cls(r.request_id, prompt, r.prompt_token_ids, r.output_token_ids, r.text,
                   r.finish_reason, r.stop_reason, r.metrics, r.finish_iteration,
                   r.num_preemptions, list(r.logprobs) if wanted else None, prompt_lp)


# Stats fields read off the core's snapshot, by the snapshot's name where it differs.
_SNAPSHOT_NAMES = {"preemptions": "num_preemptions"}


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
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (Day 44)
    prefix_cache_hits: int = 0  # ... found there, so not computed
    prefix_cache_evictions: int = 0  # cached blocks given up for new K/V
    # speculative decoding (Day 76), vLLM's counter names; all 0 when it is off
    spec_decode_num_drafts: int = 0  # verify steps that checked proposals, summed over requests
    spec_decode_num_draft_tokens: int = 0  # proposals checked
    spec_decode_num_accepted_tokens: int = 0  # proposals the target accepted
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @property
    def replay_share(self) -> float:
        """Replayed decode steps over all decode steps (0 when there were none)."""
        return self.decode_steps_replayed / self.decode_steps if self.decode_steps else 0.0

    @property
    def spec_decode_mean_acceptance_length(self) -> float:
        """Tokens each verify step emitted per request: 1 + accepted / drafts (1.0: none)."""
        return (1.0 + self.spec_decode_num_accepted_tokens / self.spec_decode_num_drafts
                if self.spec_decode_num_drafts else 1.0)

    def add(self, before: CoreSnapshot, after: CoreSnapshot) -> None:
        """Count what the core did between two snapshots (the counters a snapshot holds)."""
        for f in fields(self):
            name = _SNAPSHOT_NAMES.get(f.name, f.name)
            if name in CoreSnapshot.__dataclass_fields__:
                setattr(self, f.name, getattr(self, f.name) + getattr(after, name) -
                        getattr(before, name))
        if after.spec_decode is not None:  # cumulative for the core's life: the difference
            a, b = after.spec_decode, before.spec_decode
            self.spec_decode_num_drafts += a.num_drafts - b.num_drafts
            self.spec_decode_num_draft_tokens += a.num_draft_tokens - b.num_draft_tokens
            self.spec_decode_num_accepted_tokens += (a.num_accepted_tokens -
                                                     b.num_accepted_tokens)
            pos = self.spec_decode_num_accepted_tokens_per_pos
            pos += [0] * (len(a.accepted_per_pos) - len(pos))
            for i, n in enumerate(a.accepted_per_pos):
                pos[i] += n - (b.accepted_per_pos[i] if i < len(b.accepted_per_pos) else 0)


class LLM:
    """The offline front door. ``LLM(model, **options)`` takes ``EngineConfig``'s field names
    (an unknown one is refused by name); ``LLM.from_config(config)`` takes a config whole."""

    def __init__(self, model: str | Path | None = None, **options):
        self._build(EngineConfig.from_options(model, **options))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._build(config)
        return llm

    def _build(self, config: EngineConfig) -> None:
        self.engine_config = config
        from nanoserve.tp.worker import worker_rank

        self.worker_rank = worker_rank(config)  # torchrun's rank > 0: a worker, not a driver
        if self.worker_rank:
            from nanoserve.tp.worker import run_external

            run_external(config.device, config.distributed_timeout_s)  # until rank 0 stops
            self.core = None
            return
        self.core = load_core(config)
        loaded = self.core.loaded
        self.config = loaded.model_config  # the checkpoint's shapes (ModelConfig)
        self.tokenizer, self.model, self.engine = loaded.tokenizer, loaded.model, loaded.engine
        self.device, self.dtype, self.dtype_reason = loaded.device, loaded.dtype, \
            loaded.dtype_reason
        self.prepacked, self.prepack_reason = loaded.prepacked, loaded.prepack_reason
        self.kernels, self.kernels_reason = loaded.kernels, loaded.kernels_reason
        self.attention = loaded.attention  # what attention="auto" chose
        self.binding = loaded.binding  # the CPUs generate's threads run on (threads.py)
        self.eos_token_ids, self.max_model_len = loaded.eos_token_ids, loaded.max_model_len
        self.batching, self.allocation = config.batching, config.allocation_policy
        self.max_num_seqs, self.enable_kv_cache = config.max_num_seqs, config.enable_kv_cache
        self.cuda_graphs, self.compact_rows = config.cuda_graphs, config.persistent_batch
        # generation_config.json's sampling defaults (generation_config="auto"), by
        # SamplingParams' names; generate(prompts) without params starts from them
        self.generation_defaults = dict(loaded.generation_defaults.values)
        self.stats = Stats()

    @property
    def is_driver(self) -> bool:
        """False on a torchrun rank other than 0: it ran rank 0's forwards until rank 0 shut
        down, and generates nothing itself."""
        return not self.worker_rank

    def shutdown(self) -> None:
        """Stop what the engine runs outside this process (tensor-parallel workers). Idempotent;
        also at the end of a ``with LLM(...)`` block and at the interpreter's exit."""
        if self.core is not None:
            self.core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate(prompts)`` runs with when given no ``SamplingParams``: vLLM's
        defaults with the checkpoint's ``generation_config.json`` on top, as vLLM's method of
        this name does. A ``SamplingParams`` passed in is taken whole (every field of it is
        the caller's); start from this one (``dataclasses.replace``) to keep the defaults."""
        return SamplingParams(**self.generation_defaults)

    # ---------------------------------------------------------------- input checks

    def _prompt_ids(self, i: int, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest(f"prompt {i} is empty", "prompt")
            if self.tokenizer is None:
                raise InvalidRequest("text prompts need a tokenizer; this LLM was built with "
                                     "skip_tokenizer_init=True, so pass token ids", "prompt")
            return prompt, self.tokenizer.encode(prompt)
        return None, [int(t) for t in prompt]

    def make_requests(self, prompts, sampling_params=None
                      ) -> tuple[list[Request], list[str | None]]:
        """Check every prompt and its parameters and make their requests, changing nothing:
        a bad request anywhere means no work starts. Returns the requests and the prompts'
        texts (None for token ids)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts is empty")
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
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
        if self.worker_rank:
            raise RuntimeError(f"this process is tensor-parallel rank {self.worker_rank}, a "
                               f"worker: only rank 0 generates (check llm.is_driver)")
        reqs, texts = self.make_requests(prompts, sampling_params)
        core, before = self.core, self.core.snapshot()
        with torch.inference_mode(), pinned(self.binding):
            for r in reqs:
                core.add(r)
            core.run_to_completion()
        self.stats.add(before, core.snapshot())
        for r in reqs:  # the iteration of this call that produced its last token (1-based)
            if r.finish_iteration is not None:
                r.finish_iteration -= before.iterations
        self.stats.generated_tokens += sum(len(r.output_token_ids) for r in reqs)
        core.check_drained()
        failed = [r for r in reqs if r.finish_reason == "error"]
        if failed:  # the offline API has no one to hand a half answer to: say so, loudly
            raise RuntimeError(f"{len(failed)} of {len(reqs)} requests failed: a forward raised "
                               f"during their step (every block is back in the pool)")
        return [RequestOutput.of(r, text) for r, text in zip(reqs, texts, strict=True)]
