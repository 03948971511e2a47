"""The vLLM arm of ``nanoserve bench offline``: a vLLM process in its own venv, over a pipe.

Why this module exists: vLLM's CPU build pins its own torch and cannot be imported beside
nanoserve, so this adapter starts ``vllm_runner.py`` under ``.venv-vllm``'s Python and talks to
it in JSON lines (the protocol is in that file's docstring). It keeps vLLM's log in
``build/offline-logs``, reads from it the cores vLLM bound its OpenMP threads to, and reports
vLLM's own generate time for each run, without the pipe's millisecond. A missing venv, or one
built for another device, is ``Skipped``: its row says why and nothing is measured.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from nanoserve.bench.adapters import Setup, Skipped
from nanoserve.bench.shapes import SHAPE_CACHE
from nanoserve.bench.workload import Workload


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
            [str(py), str(Path(__file__).with_name("vllm_runner.py")), json.dumps(cfg)],
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

    def metrics(self) -> dict:
        """vLLM's own counters now (``vllm_runner``'s ``metrics`` command); cumulative, so a
        run's share is the difference of two calls."""
        self.proc.stdin.write(json.dumps({"cmd": "metrics"}) + "\n")
        self.proc.stdin.flush()
        return self._wait("metrics", self.timeout)["metrics"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
