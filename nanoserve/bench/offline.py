"""``nanoserve bench offline``: nanoserve against its peers on one ragged workload, same run.

Why this module exists: a speed is only worth quoting as a ratio against a peer measured in the
same run, on the same checkpoint, the same prompts and the same hardware. This harness runs one
seeded ragged workload (by default 16 requests, prompts of 16-192 tokens, 16-128 new tokens each,
greedy with EOS ignored, at most 8 rows at a time) through:

- ``nanoserve``: the public ``LLM(...)`` API; options such as ``--attention`` and ``--compile``
  are passed through to it when given, and reported as ignored when this ``LLM`` has no such
  parameter;
- ``hf``: transformers' ``generate`` in static waves of 8 requests, left-padded, each wave
  running until its longest member's ``max_new_tokens``; only each request's own tokens count;
- ``hf-cb``: transformers' own continuous batching (``continuous_batching_context_manager``,
  ``attn_implementation="sdpa"`` over its paged cache), at most 8 requests per batch;
- ``vllm``: vLLM's CPU build in its own venv (``.venv-vllm``, ``make bench-peers``), run as a
  subprocess by ``vllm_runner.py`` with the same token-id prompts and
  ``SamplingParams(temperature=0, ignore_eos=True, max_tokens=...)``, ``max_num_seqs=8``, and
  vLLM's default CPU thread binding. Without that venv the row says "skipped" and why.

Every engine loads once, runs one untimed warm-up, and then the engines take turns for
``--rounds`` rounds (the order rotating each round, so drift on a shared machine falls on each
engine alike). The figure is useful tokens per second (the tokens the requests asked for, divided
by the wall time of the whole workload), the median over rounds, and the ratio nanoserve/peer. The
table (stderr) names the hardware, dtype, model, workload, batch size and each engine's threads;
``--json`` prints the same on stdout. Each row also says how many requests produced exactly
nanoserve's tokens: in float32 that is a check of the harness itself.

Threads are part of the result, so every row names its own. The in-process engines use torch's
default (every core) unless ``--threads N`` says otherwise; vLLM binds its OpenMP threads itself
(on x86 it keeps one core for its scheduler process, so on 2 cores it computes on 1). On a CPU
that other work shares, OpenMP threads that spin waiting for a descheduled sibling can make a
small model many times slower: compare at equal threads (``--threads`` = vLLM's count) too.

    nanoserve bench offline --engines nanoserve,hf,hf-cb --json
    nanoserve bench offline --shape smollm2-135m --dtype bfloat16 --requests 8 --rounds 2
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..llm import DEFAULT_MODEL, LLM
from ..sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VLLM_VENV = ROOT / ".venv-vllm"
SHAPE_CACHE = ROOT / "build" / "offline-checkpoints"
ENGINES = ("nanoserve", "hf", "hf-cb", "vllm")

# Random weights in the exact shape of published checkpoints (same bytes and FLOPs).
SHAPES: dict[str, dict] = {
    "smollm2-135m": {  # HuggingFaceTB/SmolLM2-135M
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "rope_scaling": None, "tie_word_embeddings": True, "bos_token_id": 0,
        "eos_token_id": 0, "torch_dtype": "bfloat16",
    },
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B; the same dict as chapters/common.py LLAMA_3_2_1B
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
}


def shape_config(name: str) -> dict:
    """The config of a named shape; ``tiny`` is the shipped nanoserve-tiny's own config."""
    if name == "tiny":
        return json.loads((DEFAULT_MODEL / "config.json").read_text())
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {['tiny', *SHAPES]}")
    return dict(SHAPES[name])


def shape_checkpoint(name: str, cache: Path = SHAPE_CACHE, seed: int = 0) -> Path:
    """A folder of random weights in the named shape, written by transformers' ``save_pretrained``
    (in the shape's published dtype) under ``build/``; made once, then reused."""
    out = Path(cache) / f"{name}-seed{seed}"
    if (out / "config.json").is_file():
        return out
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = shape_config(name)
    dtype = getattr(torch, cfg.pop("torch_dtype", "float32") or "float32")
    for key in ("architectures", "model_type", "dtype"):
        cfg.pop(key, None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    model.save_pretrained(tmp)
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the folder from other users
    try:
        tmp.rename(out)  # atomic: a concurrent run sees the whole folder or none of it
    except OSError:  # another run finished first; its folder is as good as ours
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------- the workload


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]
    seed: int
    prompt_lens: tuple[int, int]
    gen_lens: tuple[int, int]

    @property
    def useful_tokens(self) -> int:
        """The tokens the requests ask for: with EOS ignored, exactly what each one gets."""
        return sum(self.max_tokens)

    @property
    def max_len(self) -> int:
        return max(len(p) + m for p, m in zip(self.prompts, self.max_tokens, strict=True))

    def head(self, n: int, max_tokens: int | None = None) -> Workload:
        """The first ``n`` requests, their budgets capped at ``max_tokens`` (the warm-up)."""
        cap = [min(m, max_tokens) if max_tokens else m for m in self.max_tokens[:n]]
        return Workload(self.prompts[:n], cap, self.seed, self.prompt_lens, self.gen_lens)


def make_workload(requests: int = 16, prompt_lens: tuple[int, int] = (16, 192),
                  gen_lens: tuple[int, int] = (16, 128), vocab_size: int = 2048,
                  seed: int = 0) -> Workload:
    """Seeded: the same arguments give the same prompt ids and output lengths, every time."""
    import random

    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    for name, (lo, hi) in (("prompt_lens", prompt_lens), ("gen_lens", gen_lens)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be 1 <= min <= max, got {lo},{hi}")
    rng = random.Random(seed)
    lens = [rng.randint(*prompt_lens) for _ in range(requests)]
    gens = [rng.randint(*gen_lens) for _ in range(requests)]
    prompts = [[rng.randrange(2, vocab_size) for _ in range(n)] for n in lens]
    return Workload(prompts, gens, seed, tuple(prompt_lens), tuple(gen_lens))


def static_waves(n: int, batch: int) -> list[list[int]]:
    """Arrival order, ``batch`` requests at a time."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def wave_accounting(max_tokens: list[int], batch: int) -> dict:
    """What static waves cost: every row of a wave decodes until the wave's longest member is
    done, but only each request's own ``max_tokens`` are useful."""
    waves = static_waves(len(max_tokens), batch)
    computed = sum(len(w) * max(max_tokens[i] for i in w) for w in waves)
    useful = sum(max_tokens)
    return {"waves": len(waves), "useful_tokens": useful, "computed_tokens": computed,
            "wasted_tokens": computed - useful}


# ---------------------------------------------------------------- hardware


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware(device: str) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    hw = {"cpu": cpu_model(), "cores": cores, "cpu_count": os.cpu_count(),
          "loadavg_1m": round(os.getloadavg()[0], 2), "torch": torch.__version__,
          "device": device}
    if torch.device(device).type == "cuda":
        hw["gpu"] = torch.cuda.get_device_name()
        hw["cuda"] = torch.version.cuda
    return hw


def describe_hardware(hw: dict) -> str:
    where = f"{hw['gpu']} (CUDA {hw['cuda']}) on " if "gpu" in hw else ""
    return (f"{where}{hw['cpu']}, {hw['cores']} cores usable of {hw['cpu_count']}, "
            f"load average {hw['loadavg_1m']} (1 min), torch {hw['torch']}")


# ---------------------------------------------------------------- engines


class Skipped(Exception):
    """An engine that cannot run here; the reason goes in its row, nothing is measured."""


@dataclass
class Setup:
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
    name = "nanoserve"

    def __init__(self, s: Setup):
        params = inspect.signature(LLM.__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        given = dict(s.nanoserve_options)
        passed = {k: v for k, v in given.items() if takes_any or k in params}
        self.ignored = sorted(set(given) - set(passed))
        self.llm = LLM(s.model, dtype=s.dtype, device=s.device, max_model_len=s.max_model_len,
                       skip_tokenizer_init=True, max_num_seqs=s.batch, **passed)
        self.version = "nanoserve " + _version("nanoserve")
        self.threads = f"torch {torch.get_num_threads()}"
        self.notes = [f"{k}={v}" for k, v in passed.items()]
        self.notes += [f"ignored {k} (this LLM has no such parameter)" for k in self.ignored]

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


class VllmEngine:
    """vLLM in ``.venv-vllm``, driven over JSON lines by ``vllm_runner.py``."""

    name = "vllm"

    def __init__(self, s: Setup):
        py = Path(s.vllm_venv) / "bin" / "python"
        if not py.is_file():
            raise Skipped(f"no vLLM venv at {s.vllm_venv} (make bench-peers creates it)")
        self.timeout, self.last_wall_s = s.vllm_timeout_s, None
        logs = SHAPE_CACHE.parent / "offline-logs"  # build/offline-logs, beside the checkpoints
        try:
            logs.mkdir(parents=True, exist_ok=True)
        except OSError:
            logs = Path(tempfile.gettempdir())
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", dir=logs,
                                               delete=False)
        cfg = {"model": str(s.model), "dtype": s.dtype, "max_model_len": s.max_model_len,
               "max_num_seqs": s.batch, "options": s.vllm_options}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default (4) is a lot here
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # the log names the cores it bound
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [str(py), "-P", str(Path(__file__).with_name("vllm_runner.py")), json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
            cwd=tempfile.gettempdir())
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self._wait("hello", 300)
        self.version = f"vllm {hello['version']} ({hello['platform']})"
        if torch.device(s.device).type != hello["platform"]:
            self.close()
            raise Skipped(f"{py} holds vLLM for {hello['platform']}, the run is on {s.device}")
        self._wait("ready", self.timeout)
        self.threads = self._omp_threads(env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
        self.notes = [f"max_num_seqs {s.batch}, KV space {env['VLLM_CPU_KVCACHE_SPACE']} GiB, "
                      f"log {self.log.name}"]

    def _omp_threads(self, bind: str) -> str:
        """The cores vLLM's worker bound its OpenMP threads to, as its log says."""
        import re

        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        cores = re.search(r"local_rank=0, core ids=\[([^\]]*)\]", text)
        reserved = re.search(r"reserved_cpus=\[([^\]]*)\]", text)
        if not cores:
            return f"OMP {bind} binding"
        n = len([c for c in cores.group(1).split(",") if c.strip()])
        out = f"OMP {n} on cores [{cores.group(1)}] ({bind})"
        if reserved and reserved.group(1).strip():
            out += f", cores [{reserved.group(1)}] reserved"
        return out

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _tail(self) -> str:
        self.log.flush()
        lines = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-6:])[-1500:]

    def _wait(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise RuntimeError(f"vLLM sent no {event!r} within {timeout:.0f}s; "
                                   f"log: {self._tail()}") from None
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"vLLM's runner exited ({code}) before {event!r}; "
                                   f"log: {self._tail()}")
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("event") == "error":
                self.close()
                raise RuntimeError(f"vLLM: {msg['error']}; log: {self._tail()}")
            if msg.get("event") == event:
                return msg

    def run(self, wl: Workload) -> list[list[int]]:
        self.proc.stdin.write(json.dumps({"cmd": "run", "prompts": wl.prompts,
                                          "max_tokens": wl.max_tokens}) + "\n")
        self.proc.stdin.flush()
        msg = self._wait("result", self.timeout)
        self.last_wall_s = msg["wall_s"]
        return msg["token_ids"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)


def make_engine(name: str, s: Setup, wl: Workload):
    if name == "nanoserve":
        return NanoserveEngine(s)
    if name == "hf":
        return HFGenerateEngine(s)
    if name == "hf-cb":
        return HFContinuousEngine(s, max(len(p) for p in wl.prompts))
    if name == "vllm":
        return VllmEngine(s)
    raise ValueError(f"unknown engine {name!r}; choose from {ENGINES}")


# ---------------------------------------------------------------- the run


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_offline(setup: Setup, wl: Workload, engines=ENGINES, rounds: int = 3,
                warmup: bool = True, log=None) -> dict:
    """Load each engine, warm it up, then time the engines in turn for ``rounds`` rounds.

    Returns the rows (one per engine: ``status`` "ok", "skipped" or "error", the reason, tokens/s
    per round and their median, the ratio nanoserve/engine) and each engine's token ids."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose from {list(ENGINES)}")
    say = log or (lambda msg: None)
    rows: dict[str, dict] = {}
    live: dict[str, object] = {}
    tokens: dict[str, list[list[int]]] = {}
    for name in engines:
        row = rows[name] = {"engine": name, "status": "ok", "reason": None, "version": None,
                            "threads": None, "notes": [], "rounds_s": [], "tokens_per_s": None}
        say(f"loading {name}")
        t0 = time.perf_counter()
        try:
            e = make_engine(name, setup, wl)
        except Skipped as err:
            row.update(status="skipped", reason=str(err))
            continue
        except Exception as err:  # a peer that fails is reported as failed, never faked
            row.update(status="error", reason=f"{type(err).__name__}: {err}")
            continue
        row.update(version=e.version, threads=e.threads, notes=e.notes,
                   load_s=round(time.perf_counter() - t0, 2))
        live[name] = e
    try:
        if warmup:
            for name, e in list(live.items()):
                say(f"warming up {name}")
                try:
                    e.run(wl.head(setup.batch, max_tokens=8))
                except Exception as err:
                    rows[name].update(status="error", reason=f"warm-up: {type(err).__name__}: "
                                                             f"{err}")
                    live.pop(name).close()
        order = list(live)
        for r in range(rounds):
            k = r % max(1, len(order))  # rotate: each engine takes each place in turn
            for name in order[k:] + order[:k]:
                if name not in live:
                    continue
                say(f"round {r + 1}/{rounds}: {name}")
                _sync(setup.device)
                t0 = time.perf_counter()
                try:
                    out = live[name].run(wl)
                except Exception as err:
                    rows[name].update(status="error", reason=f"round {r + 1}: "
                                                             f"{type(err).__name__}: {err}")
                    live.pop(name).close()
                    continue
                _sync(setup.device)
                wall = time.perf_counter() - t0
                # vLLM's own generate time, without the pipe to its process (a millisecond)
                wall = getattr(live[name], "last_wall_s", None) or wall
                got = [len(t) for t in out]
                if got != wl.max_tokens:
                    rows[name].update(status="error", reason=f"returned {sum(got)} tokens, "
                                                             f"not {wl.useful_tokens}")
                    live.pop(name).close()
                    continue
                rows[name]["rounds_s"].append(round(wall, 4))
                tokens.setdefault(name, out)
    finally:
        for e in live.values():
            e.close()
        _HF_MODELS.clear()
    base = None
    for name, row in rows.items():
        if row["status"] == "ok" and row["rounds_s"]:
            med = statistics.median(row["rounds_s"])
            row.update(wall_s=round(med, 4), tokens_per_s=round(wl.useful_tokens / med, 2),
                       tokens_per_s_rounds=[round(wl.useful_tokens / w, 2)
                                            for w in row["rounds_s"]])
        if name == "nanoserve":
            base = row["tokens_per_s"]
    ref = tokens.get("nanoserve")
    for name, row in rows.items():
        row["nanoserve_ratio"] = (round(base / row["tokens_per_s"], 3)
                                  if base and row["tokens_per_s"] else None)
        if ref is not None and name in tokens:
            row["same_tokens_as_nanoserve"] = sum(a == b for a, b in zip(tokens[name], ref,
                                                                         strict=True))
    if "hf" in rows:
        rows["hf"]["static_waves"] = wave_accounting(wl.max_tokens, setup.batch)
    return {"rows": list(rows.values()), "token_ids": tokens}


# ---------------------------------------------------------------- the command


def _pair(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX, got {text!r}") from None
    return lo, hi


def _json_or_str(text: str) -> object:
    """``true``, ``8``, ``null`` as JSON; anything else as the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), _json_or_str(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint folder (default: the shipped nanoserve-tiny)")
    p.add_argument("--shape", choices=["tiny", *SHAPES], default=None,
                   help="random weights in this exact shape, cached under build/")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", default=None, help="default: cuda where present, else cpu")
    p.add_argument("--engines", default="nanoserve,hf,hf-cb,vllm",
                   help=f"comma-separated, from {','.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-lens", type=_pair, default=(16, 192), help="MIN,MAX prompt tokens")
    p.add_argument("--gen-lens", type=_pair, default=(16, 128), help="MIN,MAX new tokens")
    p.add_argument("--batch", type=int, default=8, help="rows at a time, every engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for the in-process engines (default: torch's own)")
    p.add_argument("--attention", default=None, help="passed to nanoserve's LLM when given")
    p.add_argument("--compile", nargs="?", const=True, default=None, type=_json_or_str,
                   help="passed to nanoserve's LLM when given (a bare flag means True)")
    p.add_argument("--llm-option", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="more keyword arguments for nanoserve's LLM")
    p.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    p.add_argument("--vllm-option", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="more keyword arguments for vllm.LLM")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--record", default=None, metavar="PATH",
                   help="also write the report as a chapter's results file (machine, date, "
                        "command, values)")


def main(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.model and args.shape:
        print("nanoserve bench offline: error: give --model or --shape, not both",
              file=sys.stderr)
        return 2
    try:
        model = Path(args.model) if args.model else (
            shape_checkpoint(args.shape) if args.shape else DEFAULT_MODEL)
        config = json.loads((model / "config.json").read_text())
        wl = make_workload(args.requests, args.prompt_lens, args.gen_lens,
                           config["vocab_size"], args.seed)
        if args.batch < 1:
            raise ValueError(f"--batch must be >= 1, got {args.batch}")
        options = dict(args.llm_option)
        for key in ("attention", "compile"):
            if getattr(args, key) is not None:
                options[key] = getattr(args, key)
        max_model_len = min(wl.max_len, config["max_position_embeddings"])
        if wl.max_len > max_model_len:
            raise ValueError(f"the workload needs {wl.max_len} positions; the model has "
                             f"{max_model_len}")
        setup = Setup(model, args.dtype, device, args.batch, max_model_len, options,
                      Path(args.vllm_venv), dict(args.vllm_option))
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        hw = hardware(device)
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            with console.status("") as status:
                result = run_offline(setup, wl, engines, args.rounds, not args.no_warmup,
                                     log=lambda m: status.update(f"bench offline: {m}"))
        else:  # a log: one line per step, with the time, so a slow step shows where it is
            t0 = time.perf_counter()
            result = run_offline(
                setup, wl, engines, args.rounds, not args.no_warmup,
                log=lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] bench offline: {m}",
                                    file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"nanoserve bench offline: error: {e}", file=sys.stderr)
        return 2
    hw["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    report = {"hardware": hw, "model": str(model), "shape": args.shape,
              "model_name": args.shape or model.name, "dtype": args.dtype,
              "workload": {"requests": args.requests, "prompt_lens": list(wl.prompt_lens),
                           "gen_lens": list(wl.gen_lens), "seed": wl.seed,
                           "useful_tokens": wl.useful_tokens, "batch": args.batch,
                           "max_model_len": max_model_len},
                "rounds": args.rounds, "rows": result["rows"],
                "ratios": {r["engine"]: r["nanoserve_ratio"] for r in result["rows"]
                           if r["engine"] != "nanoserve" and r["nanoserve_ratio"]}}
    print_table(report, console)
    if args.json:
        print(json.dumps(report))
    if args.record:
        command = "nanoserve bench offline " + " ".join(sys.argv[1:]).split("bench offline ")[-1]
        Path(args.record).write_text(json.dumps(as_record(report, command), indent=1) + "\n")
    return 0 if all(r["status"] != "error" for r in result["rows"]) else 1


def as_record(report: dict, command: str, date: str | None = None) -> dict:
    """A report as a chapter's ``recorded`` results file: the machine, the date and the command
    that made it, the ratios under ``values`` (``ratio_hf``, ``ratio_hf_cb``, ``ratio_vllm``)
    with each engine's tokens/s, and the whole report beside them."""
    import datetime

    hw = report["hardware"]
    values = {f"ratio_{e.replace('-', '_')}": r for e, r in report["ratios"].items()}
    values.update({f"tokens_per_s_{r['engine'].replace('-', '_')}": r["tokens_per_s"]
                   for r in report["rows"] if r["status"] == "ok"})
    return {"machine": f"{platform.machine()} {hw['cpu']}, {hw['cores']} cores, "
                       + (hw.get("gpu") or "no GPU"),
            "date": date or datetime.date.today().isoformat(), "command": command,
            "values": values, "report": report}


def print_table(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(stderr=True)
    if not console.is_terminal:  # a log or a pipe: wide enough for the table, not 80
        console = Console(stderr=True, width=132)
    w, hw = report["workload"], report["hardware"]
    table = Table(
        title=f"nanoserve bench offline: {report['model_name']}, {report['dtype']}, "
              f"{w['batch']} rows at a time, on {hw['device']}",
        caption=f"Hardware: {describe_hardware(hw)} (after the run: "
                f"{hw.get('loadavg_1m_after', '?')}).\nWorkload: {w['requests']} requests, "
                f"prompts {w['prompt_lens'][0]}-{w['prompt_lens'][1]} tokens, outputs "
                f"{w['gen_lens'][0]}-{w['gen_lens'][1]} ({w['useful_tokens']} useful tokens), "
                f"greedy, EOS ignored, seed {w['seed']}; the median of {report['rounds']} "
                f"interleaved rounds after a warm-up.",
        caption_justify="left")
    for col, justify in (("engine", "left"), ("version", "left"), ("threads", "left"),
                         ("useful tok/s", "right"), ("each round", "right"),
                         ("nanoserve / it", "right"), ("same tokens", "right")):
        table.add_column(col, justify=justify, overflow="fold")
    notes = []
    for r in report["rows"]:
        if r["status"] != "ok":
            table.add_row(r["engine"], r["version"] or "", r["threads"] or "", r["status"],
                          "", "", "")
            notes.append(f"{r['engine']}: {r['status']}: {r['reason']}")
            continue
        same = r.get("same_tokens_as_nanoserve")
        extra = list(r["notes"])
        if "static_waves" in r:
            sw = r["static_waves"]
            extra.append(f"{sw['computed_tokens']} row-tokens decoded for "
                         f"{sw['useful_tokens']} useful")
        if extra:
            notes.append(f"{r['engine']}: " + "; ".join(extra))
        table.add_row(r["engine"], r["version"], r["threads"], f"{r['tokens_per_s']:.1f}",
                      " ".join(f"{x:.0f}" for x in r["tokens_per_s_rounds"]),
                      f"{r['nanoserve_ratio']:.2f}x" if r["nanoserve_ratio"] else "",
                      "" if same is None else f"{same}/{w['requests']}")
    console.print(table)
    for line in notes:
        console.print(f"  {line}", highlight=False, markup=False)
