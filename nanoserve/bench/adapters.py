"""The engines ``nanoserve bench offline`` compares, each behind one small interface.

Why this module exists: a ratio against a peer is fair only if every engine gets the same
token-id prompts, the same budgets, greedy sampling with EOS ignored and the same batch limit,
and if the wrapping costs none of them anything inside the timed run. Each adapter loads its
engine once (``__init__``, untimed), turns a ``Workload`` into one list of token ids per request
(``run``, timed), names its version and threads, and releases what it holds (``close``):

- ``nanoserve``: the public ``LLM(model, **options)``; the options (``--attention``,
  ``--compile``, ``--llm-option``) go straight to it, and it refuses one it does not know;
- ``hf``: transformers' ``generate`` in static waves of ``batch`` requests, left-padded, each
  wave running until its longest member's ``max_new_tokens``; only each request's own tokens
  count;
- ``hf-cb``: transformers' own continuous batching (``init_continuous_batching``, sdpa over its
  paged cache), at most ``batch`` requests per batch;
- ``vllm``: vLLM's CPU build in its own venv (``.venv-vllm``, ``make bench-peers``), run as a
  subprocess (``vllm_engine.py`` here, ``vllm_runner.py`` there) with ``max_num_seqs=batch``
  and vLLM's default CPU thread binding. Without that venv, ``Skipped`` says why and nothing is
  measured. ``runner.make_engine`` builds the one a name asks for.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanoserve.bench.shapes import ROOT
from nanoserve.bench.workload import Workload, static_waves
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams

DEFAULT_VLLM_VENV = ROOT / ".venv-vllm"
ENGINES = ("nanoserve", "hf", "hf-cb", "vllm")


class Skipped(Exception):
    """An engine that cannot run here; the reason goes in its row, nothing is measured."""


@dataclass
class Setup:
    """What every engine is given alike: the checkpoint, dtype, device, batch limit and context
    length; then each engine's own options (nanoserve's ``LLM``, vLLM's venv and ``vllm.LLM``)."""

    model: Path
    dtype: str
    device: str
    batch: int
    max_model_len: int
    nanoserve_options: dict = field(default_factory=dict)
    vllm_venv: Path = DEFAULT_VLLM_VENV
    vllm_options: dict = field(default_factory=dict)
    vllm_timeout_s: float = 1800.0


class NanoserveEngine:
    """The public ``LLM(...)``, greedy with EOS ignored, ``max_num_seqs`` the batch limit."""

    name = "nanoserve"

    def __init__(self, s: Setup):
        # LLM refuses an option it does not know (a ValueError naming it): nothing is dropped.
        self.llm = LLM(s.model, dtype=s.dtype, device=s.device, max_model_len=s.max_model_len,
                       skip_tokenizer_init=True, max_num_seqs=s.batch, **s.nanoserve_options)
        self.version = "nanoserve " + _version("nanoserve")
        cpus = self.llm.binding.cpus
        self.threads = f"torch {torch.get_num_threads()}" + (
            f", pinned to CPU{'s' * (len(cpus) > 1)} {','.join(map(str, cpus))}" if cpus
            else ", not pinned")
        self.notes = [f"{k}={v}" for k, v in s.nanoserve_options.items()]

    def run(self, wl: Workload) -> list[list[int]]:
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                  for m in wl.max_tokens]
        return [list(o.token_ids) for o in self.llm.generate(wl.prompts, params)]

    def close(self) -> None:
        self.llm = None


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


_HF_MODELS: dict = {}


def _hf_model(s: Setup):
    """One transformers model per setup, shared by the ``hf`` and ``hf-cb`` arms (sdpa needs no
    switch for continuous batching, so the shared model is not changed by it)."""
    key = (str(s.model), s.dtype, s.device)
    if key not in _HF_MODELS:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(s.model, dtype=getattr(torch, s.dtype),
                                                     attn_implementation="sdpa")
        model = model.to(s.device).eval()
        model.generation_config.eos_token_id = None  # EOS ignored: nothing may stop a row
        _HF_MODELS.clear()
        _HF_MODELS[key] = model
    return _HF_MODELS[key]


def release_models() -> None:
    """Drop the shared transformers model, once every engine of a run is closed."""
    _HF_MODELS.clear()


class HFGenerateEngine:
    """transformers' ``generate`` in static waves: left-padded, each wave decoding until its
    longest member's budget; every request keeps only its own ``max_tokens``."""

    name = "hf"

    def __init__(self, s: Setup):
        self.model, self.s = _hf_model(s), s
        self.pad = 0
        self.version = "transformers " + _version("transformers")
        self.threads = f"torch {torch.get_num_threads()}"
        self.notes = [f"static waves of {s.batch}, left-padded, sdpa"]

    def run(self, wl: Workload) -> list[list[int]]:
        from transformers import GenerationConfig

        outs: list[list[int]] = [[] for _ in wl.prompts]
        for wave in static_waves(len(wl.prompts), self.s.batch):
            prompts = [wl.prompts[i] for i in wave]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            longest = max(wl.max_tokens[i] for i in wave)
            gc = GenerationConfig(do_sample=False, max_new_tokens=longest, eos_token_id=None,
                                  pad_token_id=self.pad)
            with torch.inference_mode():
                out = self.model.generate(ids.to(self.s.device),
                                          attention_mask=mask.to(self.s.device),
                                          generation_config=gc)
            rows = out[:, width:].tolist()
            for row, i in zip(rows, wave, strict=True):
                outs[i] = row[:wl.max_tokens[i]]
        return outs

    def close(self) -> None:
        self.model = None


class HFContinuousEngine:
    """transformers' continuous batching: a manager thread over its paged cache; every request
    carries its own ``max_new_tokens`` and no EOS."""

    name = "hf-cb"

    def __init__(self, s: Setup, max_prompt_len: int):
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        self.model, self.s = _hf_model(s), s
        page = 256  # transformers' default page size
        # The cache is sized by hand: on a CPU its default is 90% of the machine's RAM.
        self.cb_config = ContinuousBatchingConfig(
            page_size=page, num_blocks=s.batch * (math.ceil(s.max_model_len / page) + 1),
            max_batch_tokens=s.batch * max_prompt_len, max_requests_per_batch=s.batch,
            auto_switch_to_flash=False, allow_block_sharing=False)
        self.gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
        # One manager for the engine's life, as vLLM and nanoserve keep theirs: its cache, its
        # warm-up and its thread are set up here, outside every timed run.
        self.manager = self.model.init_continuous_batching(
            generation_config=self.gen_config, continuous_batching_config=self.cb_config)
        self.manager.warmup()
        self.manager.start()
        self.runs = 0
        self.version = "transformers " + _version("transformers")
        self.threads = f"torch {torch.get_num_threads()}"
        self.notes = [f"one continuous-batching manager, sdpa over its paged cache, "
                      f"max_requests_per_batch {s.batch}"]

    def run(self, wl: Workload) -> list[list[int]]:
        self.runs += 1
        manager = self.manager
        ids = [manager.add_request(p, request_id=f"run{self.runs}-{i}", max_new_tokens=m,
                                   eos_token_id=-1)
               for i, (p, m) in enumerate(zip(wl.prompts, wl.max_tokens, strict=True))]
        if None in ids:
            raise RuntimeError("transformers' continuous batching refused a request")
        done: dict = {}
        while len(done) < len(ids):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                if r.error is not None:
                    raise RuntimeError(f"transformers CB request {r.request_id}: {r.error}")
                done[r.request_id] = r
            elif r is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped")
        return [list(done[i].generated_tokens) for i in ids]

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=30)
            self.manager.destroy()
        self.manager = self.model = None
