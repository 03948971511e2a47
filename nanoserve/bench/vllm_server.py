"""vLLM's OpenAI server as a child process, for serving benchmarks that compare against it.

Why this module exists: ``nanoserve bench serve --url`` measures any OpenAI-compatible server,
and the fairest peer is vLLM's own, started the way its users start it
(``python -m vllm.entrypoints.openai.api_server``), from its own virtual environment
(``.venv-vllm``, ``make bench-peers``), since its CPU build pins a torch of its own.
``vllm_server`` mirrors ``local_server``: a free port of 127.0.0.1, a wait for ``/health``
bounded in time, the log kept in a file and shown if the server dies, and always a stop
(SIGTERM to its process group, then SIGKILL; vLLM runs its engine in child processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from nanoserve.bench.adapters import DEFAULT_VLLM_VENV
from nanoserve.bench.local_server import LocalServer, free_port, wait_healthy


def vllm_python(venv: str | os.PathLike | None = None) -> Path | None:
    """The venv's Python if it exists (``.venv-vllm`` by default), else None."""
    py = Path(venv or DEFAULT_VLLM_VENV) / "bin" / "python"
    return py if py.is_file() else None


@contextlib.contextmanager
def vllm_server(model, extra_args: tuple[str, ...] = (), venv=None, timeout_s: float = 600.0,
                kv_cache_space_gib: int = 2):
    """vLLM's OpenAI server on ``model`` at a free 127.0.0.1 port; yields a ``LocalServer``
    once ``/health`` answers. ``extra_args`` are vLLM's own flags (``--dtype float32``,
    ``--enable-prefix-caching``, ``--block-size 32``)."""

    py = vllm_python(venv)
    if py is None:
        raise RuntimeError(f"no vLLM venv at {venv or DEFAULT_VLLM_VENV} (make bench-peers "
                           f"creates it)")
    port = free_port()
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), *extra_args]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log",
                                     delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tempfile.gettempdir(), start_new_session=True)

        def tail() -> str:
            log.flush()
            return Path(log.name).read_text(errors="replace")[-3000:]

        try:
            wait_healthy(proc, base_url, timeout_s, tail, f"vLLM's server (log {log.name})",
                         poll_s=1.0)
            yield LocalServer(base_url, proc.pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
