"""``EngineConfig``: every engine option, once, with its default, its flag and its limit.

Why this module exists: an option used to live in five places (``LLM.__init__``'s signature and
checks, the server's flags, two bundling helpers, and a benchmark that read the signature to learn
what it could pass). Here each option is one field. Its metadata holds the help text, the CLI flag
(vLLM's spelling where vLLM has the option; where ours differs, vLLM's is accepted as an alias)
and the choices; ``validate`` holds every check, each a ``ConfigError`` that names the field and
the limit. ``LLM(model, **options)``, ``AsyncLLM``, ``nanoserve serve`` and the benchmarks build
from it, so adding an option is one field here plus the code that uses it.

>>> cfg = EngineConfig(max_num_seqs=4, cuda_graphs=True)
>>> cfg.max_num_seqs, cfg.persistent_batch   # an unset persistent batch follows the graphs
(4, True)
>>> EngineConfig.from_options(max_num_seq=4)
Traceback (most recent call last):
ValueError: unknown engine option 'max_num_seq' (did you mean 'max_num_seqs'?)
>>> EngineConfig(block_size=0)
Traceback (most recent call last):
nanoserve.config.engine.ConfigError: block_size must be >= 1, got 0
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from nanoserve.config.cpus import check_spec
from nanoserve.config.generation import GENERATION_SOURCES
from nanoserve.config.registries import ATTENTION_CHOICES, BATCHING_POLICIES
from nanoserve.config.speculative import SpeculativeConfig

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "checkpoints" / "nanoserve-tiny"

# The choices, as data: the modules that implement them import these.
ALLOCATION_POLICIES = ("reserve", "incremental")
PREFILL_POLICIES = ("packed", "padded")
DEFAULT_BATCHED_TOKENS = 512  # one step's budget offline (LLM): throughput, few long steps
SERVE_BATCHED_TOKENS = 128  # nanoserve serve's: streams wait out each step (Day 42 measured it)
PREPACK_CHOICES = ("auto", True, False)
KERNEL_CHOICES = ("auto", True, False)
TP_BACKENDS = ("mp", "external_launcher")
DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "float", "bf16", "fp16", "half")


class ConfigError(ValueError):
    """A bad engine option: ``field`` is its name, so a CLI can name its flag instead."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


def budget_problem(max_num_batched_tokens: int | None, max_num_seqs: int) -> str | None:
    """The token budget's one rule, for a config and a scheduler alike (each raises it in its
    own words: a ``ConfigError`` naming the field, a ``ValueError``): a full batch must be able
    to decode in one step. None when the budget keeps it (``None``: no budget)."""
    if max_num_batched_tokens is not None and max_num_batched_tokens < max_num_seqs:
        return (f"max_num_batched_tokens={max_num_batched_tokens} is below max_num_seqs="
                f"{max_num_seqs}: a full batch could not decode in one step")
    return None


def _tristate(text: str) -> bool | str:
    """``auto``, ``true``/``on`` or ``false``/``off``, as ``prepack`` takes them."""
    words = {"auto": "auto", **dict.fromkeys(("true", "on", "1", "yes"), True),
             **dict.fromkeys(("false", "off", "0", "no"), False)}
    if (low := text.strip().lower()) in words:
        return words[low]
    raise argparse.ArgumentTypeError(f"expected auto, on or off, got {text!r}")


def option(default, help: str, *, flag: str | None = None, aliases: tuple[str, ...] = (),
           vllm: str | None = None, choices=None, cli: dict | None = None):
    """A field with everything a front door needs to know about it. ``vllm`` is vLLM's name
    for the option (``None``: vLLM has none); ``cli`` holds extra argparse keywords."""
    meta = {"help": help, "flag": flag, "aliases": aliases, "vllm": vllm, "choices": choices,
            "cli": cli or {}}
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # What to load, and where.
    model: Path = option(DEFAULT_MODEL, "HF checkpoint folder: config.json, safetensors, "
                         "tokenizer.json (default: the shipped nanoserve-tiny)", vllm="model",
                         cli={"type": Path})
    dtype: str = option("auto", "weights and cache dtype; auto: bf16 where the CPU multiplies "
                        "it natively, else float32 (a card: the checkpoint's)",
                        vllm="dtype", choices=DTYPES)
    device: str = option("cpu", "cpu, cuda or cuda:N", vllm="device")
    max_model_len: int | None = option(None, "the longest sequence, prompt plus output "
                                       "(default: the model's max_position_embeddings)",
                                       vllm="max_model_len", cli={"type": int})
    generation_config: str = option("auto", "sampling defaults: auto reads the model folder's "
                                    "generation_config.json, vllm ignores it, or a folder that "
                                    "holds one; a request's own value wins",
                                    vllm="generation_config")
    skip_tokenizer_init: bool = option(False, "load no tokenizer: prompts must be token ids, "
                                       "no chat", vllm="skip_tokenizer_init")
    # The cache and the batch.
    enable_kv_cache: bool = option(True, "keep a KV cache; off recomputes the whole sequence "
                                   "for every token (Day 4)", flag="--kv-cache")
    block_size: int = option(16, "tokens per KV block", vllm="block_size", cli={"type": int})
    num_kv_blocks: int | None = option(None, "KV blocks in the pool (default: enough for "
                                       "max_num_seqs full sequences, at most 1 GiB)",
                                       aliases=("--num-gpu-blocks-override",),
                                       vllm="num_gpu_blocks_override", cli={"type": int})
    max_num_seqs: int = option(8, "requests in the running batch at once", vllm="max_num_seqs",
                               cli={"type": int})
    max_num_batched_tokens: int | None = option(
        None, "tokens one step may compute, decodes first (Day 41) (default with chunked "
        f"prefill: {SERVE_BATCHED_TOKENS} for nanoserve serve, {DEFAULT_BATCHED_TOKENS} "
        f"offline; without it max(max_model_len, {DEFAULT_BATCHED_TOKENS}))",
        vllm="max_num_batched_tokens", cli={"type": int})
    enable_chunked_prefill: bool = option(True, "cut the last prompt that does not fit the "
                                          "budget, and run prefill chunks and decodes in one "
                                          "forward; off: whole prompts, separate forwards",
                                          vllm="enable_chunked_prefill")
    enable_prefix_caching: bool = option(False, "find full KV blocks again by a chained hash "
                                         "of their tokens and skip computing them (Day 43)",
                                         vllm="enable_prefix_caching")
    batching: str = option("continuous", "continuous (Day 31) or static waves (Day 29)",
                           choices=tuple(BATCHING_POLICIES))
    allocation: str | None = option(None, "incremental: blocks a step at a time, preempting "
                                    "by recompute (Day 33); reserve: the worst case up front "
                                    "(default: incremental; static waves always reserve)",
                                    choices=ALLOCATION_POLICIES)
    # How a step is computed: each fast path beside the plain one it replaces.
    prefill: str = option("packed", "packed: the prompts as one stream; padded: Day 27's "
                          "rectangle", choices=PREFILL_POLICIES)
    attention: str = option("auto", "the decode read: Day 28's rectangle, Day 50's gathered "
                            "mapping, the Triton kernel or the C++ CPU kernel (Day 55; it reads "
                            "fresh prompts too); auto: cpu where the C++ ops are on, else "
                            "gathered",
                            choices=ATTENTION_CHOICES)
    kernels: bool | str = option("auto", "the C++ CPU ops (Days 54-55): fused norm, RoPE with "
                                 "the cache write, SiLU-and-multiply; auto: on a CPU where they "
                                 "build", choices=KERNEL_CHOICES,
                                 cli={"type": _tristate, "metavar": "{auto,on,off}"})
    compile: bool | str = option(False, "decode through torch.compile (Day 49); the API also "
                                 "takes a backend name")
    cuda_graphs: bool = option(False, "decode through recorded windows (Day 57); eager replay "
                               "without CUDA; turns on the persistent batch unless "
                               "--no-persistent-batch")
    compact_rows: bool | None = option(None, "compact running rows to 0..n-1 (Day 58); unset: "
                                       "follows --cuda-graphs", flag="--persistent-batch")
    prepack: bool | str = option("auto", "oneDNN-packed linear weights: auto packs bf16 on a "
                                 "CPU, and float32 where measured faster (cpu/onednn.py)",
                                 choices=PREPACK_CHOICES,
                                 cli={"type": _tristate, "metavar": "{auto,on,off}"})
    threads_bind: str = option("auto", "pin the compute threads (threads.py): auto: one per "
                               "physical core; nobind; or a CPU list such as 0-3,8 (vLLM: "
                               "VLLM_CPU_OMP_THREADS_BIND)")
    # Tensor parallelism (Days 64-66): the model split over ranks, one process each.
    tensor_parallel_size: int = option(1, "ranks the model is split over (Megatron's split, "
                                       "one process per rank; gloo on a CPU, NCCL on cards)",
                                       aliases=("-tp",), vllm="tensor_parallel_size",
                                       cli={"type": int})
    distributed_executor_backend: str = option(
        "mp", "mp: this engine starts the worker ranks (torch.multiprocessing); "
        "external_launcher: torchrun started every rank", vllm="distributed_executor_backend",
        choices=TP_BACKENDS)
    distributed_timeout_s: float = option(60.0, "the longest rank 0 waits on a worker rank in "
                                          "one collective before the engine fails",
                                          cli={"type": float})
    # Speculative decoding (Days 76-78): proposals verified k at a time, lossless.
    speculative_config: SpeculativeConfig | None = option(
        None, "vLLM's JSON: {\"method\": \"ngram\" or \"draft_model\", "
        "\"num_speculative_tokens\": k, ...} (default: off)", vllm="speculative_config")
    # Fault injection, for the tests of what a failed forward costs.
    fail_on_step: tuple[int, ...] = option((), "make the forward raise at these engine steps "
                                           "(fault injection)",
                                           cli={"type": int, "nargs": "*"})

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normal forms only, never a repaired value
        set_(self, "model", DEFAULT_MODEL if self.model is None else Path(self.model))
        set_(self, "fail_on_step", tuple(self.fail_on_step))
        if self.speculative_config is not None:
            try:
                set_(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
            except ValueError as e:
                raise ConfigError("speculative_config", str(e)) from None
        self.validate()

    # ------------------------------------------------------------------ checks

    def validate(self) -> None:
        """Every check an option has, in one place. Needs no checkpoint; the one check that
        does (``max_model_len`` against the model) is ``resolve_max_model_len``."""
        if not self.model.is_dir():
            raise ConfigError("model", f"model folder {self.model} does not exist")
        import torch

        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError("device", f"device={self.device!r} is not a device ({e})") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", f"device={self.device!r} but CUDA is not available on "
                                        f"this machine")
        g = self.generation_config
        if not isinstance(g, (str, Path)) or (g not in GENERATION_SOURCES and not Path(g).is_dir()):
            raise ConfigError("generation_config", f"generation_config={g!r}: choose auto, vllm "
                                                   f"or a folder that exists")
        if isinstance(self.dtype, str) and self.dtype not in DTYPES:
            raise ConfigError("dtype", f"dtype={self.dtype!r}; choose one of {DTYPES}")
        for name in ("block_size", "max_num_seqs", "num_kv_blocks", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(name, f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ConfigError(name, f"{name} must be >= 1, got {value}")
        if why := budget_problem(self.max_num_batched_tokens, self.max_num_seqs):
            raise ConfigError("max_num_batched_tokens", why)
        if self.max_model_len is not None and (isinstance(self.max_model_len, bool)
                                               or not isinstance(self.max_model_len, int)
                                               or self.max_model_len < 2):
            raise ConfigError("max_model_len", f"max_model_len must be an int >= 2, got "
                                               f"{self.max_model_len!r}")
        for f in fields(self):
            choices, value = f.metadata["choices"], getattr(self, f.name)
            unset = value is None and f.default is None  # an option left to its policy
            if choices is not None and f.name != "dtype" and not unset and value not in choices:
                raise ConfigError(f.name, f"{f.name}={getattr(self, f.name)!r}; choose one of "
                                          f"{choices}")
        try:
            check_spec(self.threads_bind)
        except (ValueError, AttributeError, TypeError) as e:
            raise ConfigError("threads_bind", str(e) if isinstance(e, ValueError) else
                              f"threads_bind must be auto, nobind or a CPU list, got "
                              f"{self.threads_bind!r}") from None
        if not isinstance(self.compile, (bool, str)) or self.compile == "":
            raise ConfigError("compile", f"compile must be a bool or a backend name, got "
                                         f"{self.compile!r}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError("tensor_parallel_size", f"tensor_parallel_size must be an int >= "
                                                      f"1, got {tp!r}")
        if tp > 1 and not self.enable_kv_cache:
            raise ConfigError("tensor_parallel_size", "tensor_parallel_size > 1 runs on the "
                                                      "paged KV cache; enable_kv_cache=False "
                                                      "has none")
        t = self.distributed_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ConfigError("distributed_timeout_s", f"distributed_timeout_s must be a "
                                                       f"number > 0, got {t!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1
               for s in self.fail_on_step):
            raise ConfigError("fail_on_step", f"fail_on_step holds step numbers >= 1, got "
                                              f"{self.fail_on_step!r}")
        self._check_policies()

    def _check_policies(self) -> None:
        """Options that one policy cannot honour beside another are refused, never ignored."""
        if self.batching == "static":
            if self.allocation == "incremental":
                raise ConfigError("allocation", "allocation='incremental' cannot be honoured "
                                                "under batching='static': a wave books each "
                                                "request's worst case (reserve) and is never "
                                                "preempted")
            for name, why in (("max_num_batched_tokens", "a wave prefills its prompts whole, "
                                                         "in one step"),
                              ("speculative_config", "a wave's rows take one token a step")):
                if getattr(self, name) is not None:
                    raise ConfigError(name, f"{name} cannot be honoured under "
                                            f"batching='static': {why}")
        if not self.enable_kv_cache:
            for name, on in (("enable_prefix_caching", self.enable_prefix_caching),
                             ("cuda_graphs", self.cuda_graphs), ("compile", self.compile),
                             ("batching", self.batching == "static"),  # held rows write K/V
                             ("speculative_config", self.speculative_config)):
                if on:
                    raise ConfigError(name, f"{name}={getattr(self, name)!r} needs the KV "
                                            f"cache; with enable_kv_cache=False every step "
                                            f"recomputes the whole sequence (Day 4)")

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """The context this engine serves: ``max_model_len`` if set, else the model's own."""
        limit = max_position_embeddings
        if self.max_model_len is not None and not 1 < self.max_model_len <= limit:
            raise ConfigError("max_model_len", f"max_model_len must be in [2, {limit}] "
                                               f"(max_position_embeddings), got "
                                               f"{self.max_model_len}")
        return self.max_model_len or limit

    def resolve_max_num_batched_tokens(self, max_model_len: int) -> int:
        """The token budget of one step (vLLM's rule): at least ``max_num_seqs``, so a full
        batch can decode; without chunked prefill at least ``max_model_len``, so every prompt
        fits whole."""
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = max(DEFAULT_BATCHED_TOKENS, self.max_num_seqs)
            return budget if self.enable_chunked_prefill else max(budget, max_model_len)
        if not self.enable_chunked_prefill and budget < max_model_len:
            raise ConfigError("max_num_batched_tokens",
                              f"max_num_batched_tokens={budget} is below max_model_len="
                              f"{max_model_len} and chunked prefill is off: a long prompt "
                              f"could never be scheduled (enable chunked prefill or raise it)")
        return budget

    def for_serving(self) -> EngineConfig:
        """This config with the server's defaults: an unset budget under chunked prefill
        becomes ``SERVE_BATCHED_TOKENS`` (at least ``max_num_seqs``). vLLM, too, keeps one
        default per usage context (its CPU build: 2048 for the server, 4096 for ``LLM``). A
        server's streams each wait out every step, and on Day 42 a 128-token step cut their
        p99 inter-token gap to well under 512's, for a long prompt's first token at most twice
        as late; offline, where nobody watches a stream, fewer and longer steps win."""
        if (self.max_num_batched_tokens is not None or not self.enable_chunked_prefill
                or self.batching == "static"):
            return self
        return replace(self, max_num_batched_tokens=max(SERVE_BATCHED_TOKENS,
                                                        self.max_num_seqs))

    @property
    def allocation_policy(self) -> str:
        """The allocation the scheduler runs: as set, else incremental (Day 33), or reserve
        under static waves."""
        if self.allocation is not None:
            return self.allocation
        return "reserve" if self.batching == "static" else "incremental"

    def non_default(self) -> dict:
        """The options set away from their defaults, by name (what the server logs at start,
        as vLLM's ``non-default args:`` line does)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != (DEFAULT_MODEL if f.name == "model" else f.default)}

    @property
    def persistent_batch(self) -> bool:
        """Compaction follows the graphs unless told otherwise: a capture replays only steps
        whose rows are 0..n-1, and compaction is what keeps them there."""
        return self.cuda_graphs if self.compact_rows is None else bool(self.compact_rows)

    # ------------------------------------------------------------------ front doors

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def default(cls, name: str):
        """The default of option ``name``, read off its field."""
        (f,) = [f for f in fields(cls) if f.name == name]
        return f.default

    @classmethod
    def from_options(cls, model=None, **options) -> EngineConfig:
        """What ``LLM(model, **options)`` takes: the field names, an unknown one refused."""
        known = cls.names()
        for name in options:
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ValueError(f"unknown engine option {name!r}{hint}")
        return cls(model=model, **options)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field (``--max-model-len``), its vLLM alias beside it, its default in
        its help. A bool is a ``--x/--no-x`` pair; an unset tristate stays ``None``."""
        group = parser.add_argument_group("engine options")
        for f in fields(cls):
            m = f.metadata
            flag = m["flag"] or "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            said = "(default:" in m["help"]  # the help says what unset means
            kw = dict(dest=f.name, default=default,
                      help=m["help"] if said else f"{m['help']} (default: {default})")
            if f.type in ("bool", "bool | None"):
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw.update(m["cli"])
                if m["choices"] is not None and "type" not in m["cli"]:
                    kw["choices"] = m["choices"]
            if f.name == "compile":  # a backend name is the API's alone; the flag is on/off
                kw["action"] = argparse.BooleanOptionalAction
            if f.name == "model":
                kw["default"] = None
            group.add_argument(flag, *m["aliases"], **kw)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineConfig:
        """The config the flags ask for; a bad value is a ``ConfigError`` naming its flag."""
        values = {name: getattr(ns, name) for name in cls.names() if hasattr(ns, name)}
        try:
            return cls(**values)
        except ConfigError as e:
            flag = cls.flag(e.field)
            raise ConfigError(e.field, f"{flag}: {e}") from None

    @classmethod
    def flag(cls, name: str) -> str:
        f = next(f for f in fields(cls) if f.name == name)
        return f.metadata["flag"] or "--" + name.replace("_", "-")
