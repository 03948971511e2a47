"""The arms of ``nanoserve bench quant``: one request decoded by nanoserve or by llama.cpp, and
the bytes a decode step reads.

Why this module exists: the quantized decode benchmark compares six arms (nanoserve bf16,
w8a16, w4a16; llama.cpp BF16, Q8_0, Q4_0) that must be timed the same way: one request, its
prompt evaluated, then ``new_tokens - 1`` greedy decode steps, decode tokens/s being those steps
over their wall time (first token to last), prompt time up to the first token. nanoserve's
figures come from its own request metrics (``first_token_time``, ``last_token_time``);
llama.cpp's from ``llamacpp_runner.py`` in its own venv, pinned to the same CPUs. The byte
ceiling needs what a step reads: every linear weight once (``QuantizedWeight.nbytes``: the
integers, and one scale per group) and the head; the embedding is a lookup of one row, and the
norms are a few KiB, so neither counts.

    arm = NanoserveArm(checkpoint, cpus=(0,))            # one LLM, pinned to CPU 0
    arm.run(prompt, 128)                                  # -> {"decode_tokens_per_s": ...}
    llamacpp_run(venv, gguf, prompt, 128, cpus=(0,))      # the same, from llama.cpp
    step_bytes(checkpoint)                                 # -> bytes one decode step reads
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from nanoserve.bench.gguf_export import read_checkpoint
from nanoserve.quantization.weight import QuantizedWeight

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_linear(name: str) -> bool:
    """A decoder layer's linear weight (``model.layers.N.*.{q,k,...}_proj.weight``)."""
    return name.startswith("model.layers.") and name.endswith(".weight") and \
        name.split(".")[-2] in LINEARS


def step_bytes(checkpoint: Path) -> dict:
    """The bytes one decode step reads from ``checkpoint``'s weights: the linears (quantized
    ones by ``QuantizedWeight.nbytes``) and the head (the embedding when tied)."""
    config, hf = read_checkpoint(checkpoint)
    linears = sum(t.nbytes() if isinstance(t, QuantizedWeight) else t.numel() * t.element_size()
                  for k, t in hf.items() if is_linear(k))
    head = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    head_bytes = head.numel() * head.element_size()
    return {"linears": int(linears), "head": int(head_bytes), "total": int(linears + head_bytes)}


class NanoserveArm:
    """``nanoserve.LLM(model=checkpoint, dtype="bfloat16")`` pinned to ``cpus``, one thread a
    CPU; ``run`` decodes one request greedily with EOS ignored."""

    def __init__(self, checkpoint: Path, cpus: tuple[int, ...], max_model_len: int = 512):
        from nanoserve.llm import LLM

        self.threads = len(cpus)
        torch.set_num_threads(self.threads)
        self.llm = LLM(model=str(checkpoint), dtype="bfloat16", skip_tokenizer_init=True,
                       max_model_len=max_model_len, max_num_seqs=8,
                       threads_bind=",".join(map(str, cpus)))
        self.describe = f"torch {self.threads}, {self.llm.binding.describe()}"

    def run(self, prompt: list[int], new_tokens: int) -> dict:
        from nanoserve.sampling.params import SamplingParams

        torch.set_num_threads(self.threads)
        out = self.llm.generate([prompt], SamplingParams(temperature=0, max_tokens=new_tokens,
                                                         ignore_eos=True))[0]
        m = out.metrics
        decode_s = m.last_token_time - m.first_token_time
        return {"prompt_s": m.first_token_time - m.arrival_time, "decode_s": decode_s,
                "decode_tokens_per_s": (new_tokens - 1) / decode_s,
                "tokens": list(out.token_ids)}

    def close(self) -> None:
        self.llm = None


def llamacpp_run(venv: Path, gguf_path: Path, prompt: list[int], new_tokens: int,
                 cpus: tuple[int, ...], rounds: int = 1, timeout_s: float = 600) -> dict:
    """One llama.cpp process on ``gguf_path``, ``len(cpus)`` threads pinned to ``cpus``: a
    warm-up, then ``rounds`` timed rounds; its JSON answer (``llamacpp_runner.py``)."""
    py = Path(venv) / "bin" / "python"
    if not py.is_file():
        raise FileNotFoundError(f"no llama.cpp venv at {venv} (make .venv-llamacpp/.setup-stamp "
                                f"creates it)")
    cfg = {"model": str(gguf_path), "threads": len(cpus), "cpus": list(cpus), "prompt": prompt,
           "new_tokens": new_tokens, "rounds": rounds, "n_ctx": 512}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with tempfile.TemporaryFile("w+") as log:
        done = subprocess.run([str(py), str(Path(__file__).with_name("llamacpp_runner.py")),
                               json.dumps(cfg)], stdout=subprocess.PIPE, stderr=log, text=True,
                              env=env, timeout=timeout_s, cwd=tempfile.gettempdir())
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            log.seek(0)
            raise RuntimeError(f"llama.cpp's runner exited {done.returncode} without an "
                               f"answer: {log.read()[-1500:]}")
    msg = json.loads(lines[-1])
    if "error" in msg:
        raise RuntimeError(f"llama.cpp: {msg['error']}")
    return msg


def first_divergence(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy runs share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
