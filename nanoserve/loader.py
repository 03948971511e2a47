"""``load_core``: an ``EngineConfig`` made real (checkpoint, tokenizer, weights, engine, core).

Why this module exists: both front doors (``LLM`` offline, ``AsyncLLM`` for serving) stand on
the same engine core, and the core stands on what a config asks for. Loading it in one function
means the two doors cannot differ in how a dtype is chosen, whether weights are packed, or how
large the KV pool is. It reads ``config.json`` (``ModelConfig``) and finds the model's family
(``nanoserve.model.registry``), settles ``max_model_len`` against the model, loads the tokenizer
and the weights, says which dtype ``"auto"`` chose and why, pre-packs the linears where that
pays, turns the C++ CPU ops on where they load (an unset ``attention`` then reads through their
kernel), chooses the attention backend, sizes the pool, builds the ``Engine`` (on one rank, or
on every rank of a tensor-parallel group, ``nanoserve.tp``) and the core over it, whose
scheduler owns the pool's bookkeeping.

Without ``num_kv_blocks`` the pool holds ``max_num_seqs`` full-length sequences, capped at
``DEFAULT_KV_BYTES`` (1 GiB), and one block more when every layer is windowed: the null block
that stands for the blocks a window gave back (``nanoserve.engine.kv_manager``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from nanoserve.attention import selector as attention_selector
from nanoserve.attention.backends.base import AttentionSpec
from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.config.generation import GenerationDefaults, read_generation_defaults
from nanoserve.cpu.csrc import resolve as resolve_kernels
from nanoserve.cpu.onednn import resolve as resolve_prepack
from nanoserve.cpu.threads import Binding, plan
from nanoserve.engine.core import EngineCore
from nanoserve.engine.engine import Engine
from nanoserve.engine.kv_manager import freeing_window
from nanoserve.model.prepare import prepare_model
from nanoserve.model.registry import model_class
from nanoserve.model.weights import choose_dtype, load_model
from nanoserve.sampling.params import SamplingParams
from nanoserve.spec_decode.proposer import proposer_class
from nanoserve.tokenizer import Tokenizer

log = logging.getLogger("nanoserve")
DEFAULT_KV_BYTES = 1 << 30  # without num_kv_blocks, the pool is at most 1 GiB


@dataclass(slots=True)
class LoadedEngine:
    """What a config loaded into: the core and the front doors read these, never reload."""

    config: EngineConfig
    model_config: ModelConfig
    tokenizer: Tokenizer | None
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    prepacked: bool
    prepack_reason: str
    kernels: bool
    kernels_reason: str
    attention: str
    eos_token_ids: frozenset[int]
    max_model_len: int
    engine: Engine
    binding: Binding  # the CPUs the forward threads are pinned to (threads.py)
    generation_defaults: GenerationDefaults | None = None  # generation_config.json's (load_core)
    quantization: str | None = None  # what a quantized checkpoint holds (model.quantization)

    def load_like(self, model_dir: str) -> tuple[torch.nn.Module, str]:
        """Another checkpoint loaded as this one was (a speculative draft, Day 77): the same
        dtype, device and C++ ops, packing measured for its own shapes, the attention backend
        chosen for its own heads; in this process only (a draft is never split). Returns the
        model and its attention backend's name."""
        cfg, mc = self.config, ModelConfig.from_dir(model_dir)
        family = model_class(mc)
        prepacked, _ = resolve_prepack(cfg.prepack, self.device, self.dtype, cfg.compile,
                                       (mc.hidden_size, mc.intermediate_size))
        model = load_model(model_dir, self.dtype, self.device, self.max_model_len)
        prepare_model(model, prepacked, self.kernels and cfg.prepack is not False, self.kernels)
        windows = family.served_windows(mc, self.max_model_len)
        return model, attention_selector.choose(
            cfg.attention, self.kernels, AttentionSpec.for_model(mc, self.dtype, self.device,
                                                                 windows))


def default_num_kv_blocks(mc: ModelConfig, max_num_seqs: int, max_model_len: int,
                          block_size: int, element_size: int) -> int:
    """Enough blocks for ``max_num_seqs`` full sequences, at most ``DEFAULT_KV_BYTES``."""
    per_block = 2 * mc.num_hidden_layers * mc.kv_size * block_size * element_size
    full = max_num_seqs * -(-max_model_len // block_size)
    return max(1, min(full, DEFAULT_KV_BYTES // per_block))


def load_engine(cfg: EngineConfig) -> LoadedEngine:
    """Every decision first (dtype, packing, the C++ ops, the attention path, the threads, the
    pool), then the weights and the engine: on one rank here, or, with
    ``tensor_parallel_size`` > 1, on every rank from the same decisions (``tp/``)."""
    attention_selector.prepare_process(cfg.attention)  # Triton's mode, before the model build
    mc = ModelConfig.from_dir(cfg.model)
    family = model_class(mc)  # an architecture nobody serves is refused before any read
    max_model_len = cfg.resolve_max_model_len(mc.max_position_embeddings)
    tp = cfg.tensor_parallel_size
    if tp > 1 and not family.tensor_parallel:
        raise ValueError(f"tensor_parallel_size={tp}: tensor parallelism does not build "
                         f"{family.__name__} ({', '.join(mc.architectures)}): the family does "
                         f"not declare tensor_parallel = True")
    if tp > 1:  # a shape that cannot be split is refused before a worker starts
        from nanoserve.tp.quantized import check_split
        from nanoserve.tp.shard import ShardPlan

        ShardPlan(mc, tp, 0)
        check_split(mc, tp)  # a quantized layer's groups must fall on the ranks' cut
    tokenizer = None if cfg.skip_tokenizer_init else Tokenizer.from_dir(cfg.model)
    device = torch.device(cfg.device)
    # the small-M kernel's copy is a packed weight too, so prepack=False keeps the weights
    # exactly as loaded; kernels=False never runs it
    may_pack = cfg.prepack is not False
    may_small = may_pack and cfg.kernels is not False
    # "auto" on a CPU: measured (only the linears these settings let the engine run), cached
    dtype, why = choose_dtype(cfg.dtype, mc, device, kernel=may_small, onednn=may_pack)
    log.info("dtype=%s: %s (%s)", cfg.dtype, str(dtype).removeprefix("torch."), why)
    prepacked, prepack_why = resolve_prepack(cfg.prepack, device, dtype, cfg.compile,
                                             (mc.hidden_size, mc.intermediate_size))
    kernels, kernels_why = resolve_kernels(cfg.kernels, device, dtype)
    if kernels and family.fused_problem:
        kernels_why += f"; {family.__name__}'s layers run in PyTorch ({family.fused_problem})"
    small_gemm = kernels and may_small  # small_gemm.choose times each shape, or refuses it
    if small_gemm and not prepacked:
        prepack_why += "; small-M copies where they beat F.linear"
    log.info("prepack=%s: %s (%s)", cfg.prepack, "packed" if prepacked else "plain",
             prepack_why)
    windows = family.served_windows(mc, max_model_len)
    attention = attention_selector.choose(cfg.attention, kernels,
                                          AttentionSpec.for_model(mc, dtype, device, windows))
    log.info("kernels=%s: %s (%s); attention=%s", cfg.kernels, "on" if kernels else "off",
             kernels_why, attention_selector.backend_class(attention).describe())
    local_rank, local_ranks = _local_ranks(cfg)
    binding = plan(cfg.threads_bind, device, local_rank, local_ranks)
    log.info("threads_bind=%s: %s", cfg.threads_bind, binding.describe())
    eos = tokenizer.eos_token_ids if tokenizer else ()
    num_kv_blocks = cfg.num_kv_blocks or default_num_kv_blocks(
        mc, cfg.max_num_seqs, max_model_len, cfg.block_size,
        torch.empty((), dtype=dtype).element_size()
    ) + (freeing_window(family.layer_windows(mc)) is not None)  # + the null block (Day 70)
    engine_kw = dict(num_kv_blocks=num_kv_blocks, block_size=cfg.block_size,
                     max_num_seqs=cfg.max_num_seqs, max_model_len=max_model_len,
                     fail_on_step=list(cfg.fail_on_step), prefill=cfg.prefill,
                     attention=attention, compile=cfg.compile, cuda_graphs=cfg.cuda_graphs,
                     kv_cache=cfg.enable_kv_cache)
    if tp > 1:
        from nanoserve.tp.executor import start_rank0
        from nanoserve.tp.rank import RankSpec

        spec = RankSpec(str(cfg.model), str(dtype).removeprefix("torch."), cfg.device, tp,
                        cfg.threads_bind, prepacked, small_gemm, kernels, engine_kw)
        _, model, engine = start_rank0(spec, cfg.distributed_executor_backend,
                                       cfg.distributed_timeout_s)
        log.info("tensor parallelism over %d ranks (%s): %s", tp,
                 cfg.distributed_executor_backend, model.shard_plan.describe())
    else:
        model = load_model(cfg.model, dtype, cfg.device, max_model_len)
        prepare_model(model, prepacked, small_gemm, kernels)
        if prepacked or small_gemm:
            log.info("small-M weights on huge pages: %s", model.huge_pages)
        engine_kw["fail_on_step"] = frozenset(engine_kw["fail_on_step"])
        engine = Engine(model, **engine_kw)
    quantization = getattr(model, "quantization", None)
    if quantization:
        log.info("quantization: %s", quantization)
    return LoadedEngine(cfg, mc, tokenizer, model, device, dtype, why, prepacked, prepack_why,
                        kernels, kernels_why, attention, frozenset(eos or mc.eos_token_ids),
                        max_model_len, engine, binding, quantization=quantization)


def load_core(cfg: EngineConfig) -> EngineCore:
    """Load what ``cfg`` names and build the engine core over it (``core.loaded`` records
    what was loaded and why)."""
    defaults = generation_defaults(cfg)  # a bad file is refused before any weight is read
    loaded = load_engine(cfg)
    loaded.generation_defaults = defaults
    proposer = None
    if cfg.speculative_config is not None:  # Day 76: who proposes, built beside the target
        spec = cfg.speculative_config
        proposer = proposer_class(spec.method).create(spec, loaded)
        log.info("speculative decoding: %s", proposer.describe())
    core = EngineCore(loaded.engine, cfg, loaded.tokenizer, loaded.eos_token_ids,
                      loaded.max_model_len, loaded.model_config.vocab_size, proposer)
    core.loaded = loaded
    return core


def generation_defaults(cfg: EngineConfig) -> GenerationDefaults:
    """The sampling defaults ``cfg.generation_config`` names, each checked as a request's value
    is (``SamplingParams``), and said in the log: every request starts from them."""
    defaults = read_generation_defaults(str(cfg.generation_config), cfg.model)
    try:
        SamplingParams(**defaults.values)
    except ValueError as e:
        raise ValueError(f"generation_config={cfg.generation_config}: {defaults.source}: "
                         f"{e}") from None
    log.info("generation_config=%s: %s", cfg.generation_config, defaults.describe())
    return defaults


def _local_ranks(cfg: EngineConfig) -> tuple[int, int]:
    """This process's rank among the ranks on this machine, and how many there are: they share
    its cores (``threads.plan``). ``mp`` starts them all here; torchrun says."""
    if cfg.tensor_parallel_size == 1:
        return 0, 1
    if cfg.distributed_executor_backend == "external_launcher":
        return int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return 0, cfg.tensor_parallel_size
