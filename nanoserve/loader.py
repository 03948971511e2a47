"""``load_engine``: an ``EngineConfig`` made real (checkpoint, tokenizer, weights, cache, engine).

Why this module exists: both front doors (``LLM`` offline, ``AsyncLLM`` for serving) stand on
the same engine core, and the core stands on what a config asks for. Loading it in one function
means the two doors cannot differ in how a dtype is chosen, whether weights are packed, or how
large the KV pool is. It reads ``config.json`` (``ModelConfig``), settles ``max_model_len``
against the model, loads the tokenizer and the weights, says which dtype ``"auto"`` chose and why,
pre-packs the linears where that pays, turns the C++ CPU ops on where they load (``csrc/``; an
unset ``attention`` then reads through their kernel), sizes the pool, and builds the ``Engine``.

Without ``num_kv_blocks`` the pool holds ``max_num_seqs`` full-length sequences, capped at
``DEFAULT_KV_BYTES`` (1 GiB).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .config import EngineConfig, ModelConfig
from .csrc import resolve as resolve_kernels
from .engine import Engine
from .prepack import prepack_model
from .prepack import resolve as resolve_prepack
from .threads import Binding, plan
from .tokenizer import Tokenizer
from .triton_mode import use_interpreter
from .weights import choose_dtype, load_model

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


def default_num_kv_blocks(mc: ModelConfig, max_num_seqs: int, max_model_len: int,
                          block_size: int, element_size: int) -> int:
    """Enough blocks for ``max_num_seqs`` full sequences, at most ``DEFAULT_KV_BYTES``."""
    per_block = 2 * mc.num_hidden_layers * mc.kv_size * block_size * element_size
    full = max_num_seqs * -(-max_model_len // block_size)
    return max(1, min(full, DEFAULT_KV_BYTES // per_block))


def load_engine(cfg: EngineConfig) -> LoadedEngine:
    if cfg.attention == "triton":  # without CUDA, the interpreter; chosen before anything
        use_interpreter()          # (the model build included) imports triton
    mc = ModelConfig.from_dir(cfg.model)
    max_model_len = cfg.resolve_max_model_len(mc.max_position_embeddings)
    tokenizer = None if cfg.skip_tokenizer_init else Tokenizer.from_dir(cfg.model)
    device = torch.device(cfg.device)
    dtype, why = choose_dtype(cfg.dtype, mc, device)  # "auto" on a CPU: measured, cached
    model = load_model(cfg.model, dtype, cfg.device)
    log.info("dtype=%s: %s (%s)", cfg.dtype, str(dtype).removeprefix("torch."), why)
    prepacked, prepack_why = resolve_prepack(cfg.prepack, device, dtype, cfg.compile)
    kernels, kernels_why = resolve_kernels(cfg.kernels, device, dtype)
    if prepacked:
        prepack_model(model, small_gemm=kernels and dtype == torch.bfloat16)
    log.info("prepack=%s: %s (%s)", cfg.prepack, "packed" if prepacked else "plain",
             prepack_why)
    if kernels:  # Llama.forward goes through fused.py
        from .fused import fused_forward
        model.fused_forward = fused_forward
    attention = cfg.attention if cfg.attention != "auto" else "cpu" if kernels else "gathered"
    log.info("kernels=%s: %s (%s); attention=%s", cfg.kernels, "on" if kernels else "off",
             kernels_why, attention)
    binding = plan(cfg.threads_bind, device)
    log.info("threads_bind=%s: %s", cfg.threads_bind, binding.describe())
    eos = tokenizer.eos_token_ids if tokenizer else ()
    num_kv_blocks = cfg.num_kv_blocks or default_num_kv_blocks(
        mc, cfg.max_num_seqs, max_model_len, cfg.block_size,
        model.embed_tokens.weight.element_size())
    engine = Engine(model, num_kv_blocks, cfg.block_size, cfg.max_num_seqs, max_model_len,
                    fail_on_step=frozenset(cfg.fail_on_step), prefill=cfg.prefill,
                    attention=attention, compile=cfg.compile, cuda_graphs=cfg.cuda_graphs,
                    prefix_caching=cfg.enable_prefix_caching)
    return LoadedEngine(cfg, mc, tokenizer, model, device, dtype, why, prepacked, prepack_why,
                        kernels, kernels_why, attention, frozenset(eos or mc.eos_token_ids),
                        max_model_len, engine, binding)
