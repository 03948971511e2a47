"""``nanoserve serve`` as a child process: started on a free 127.0.0.1 port, waited on, stopped.

Why this module exists: the serving benchmark, graphbench's serving arm and the soak all measure a
server they start themselves, and they must start it the way a user would, from the command line,
with the engine flags spelt as ``nanoserve serve --help`` spells them. ``engine_argv`` turns
``EngineConfig`` field values back into those flags, ``engine_options_set`` finds the flags a
parsed command line set away from their defaults, and ``local_server`` runs the process, waits for
``/health``, and always stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class LocalServer:
    url: str  # base URL, e.g. http://127.0.0.1:40123
    pid: int | None  # the server's process (None for a server we did not start)
    process: subprocess.Popen | None = None  # its returncode is set once local_server stops it
    log: Callable[[], str] | None = None  # the server's output so far (inside the with block)


def _engine_parser() -> argparse.ArgumentParser:
    from nanoserve.config import EngineConfig

    p = argparse.ArgumentParser(add_help=False)
    EngineConfig.add_cli_args(p)
    return p


def engine_argv(options: dict) -> list[str]:
    """``nanoserve serve`` flags for engine ``options`` (``EngineConfig``'s field names), spelt
    as ``EngineConfig.add_cli_args`` spells them: ``{"max_num_seqs": 4, "cuda_graphs": True}``
    -> ``["--max-num-seqs", "4", "--cuda-graphs"]``. An unknown name is a ``ValueError``."""
    actions = {a.dest: a for a in _engine_parser()._actions}  # argparse lists them nowhere else
    out = []
    for name, value in options.items():
        action = actions.get(name)
        if action is None or not action.option_strings:
            raise ValueError(f"{name!r} is not an engine option of nanoserve serve")
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == "*":
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, bool):  # a tristate such as --prepack {auto,on,off}
            out += [flag, "on" if value else "off"]
        else:
            out += [flag, str(value)]
    return out


def engine_options_set(args: argparse.Namespace, skip: tuple[str, ...] = ("model",)) -> dict:
    """The engine options ``args`` (parsed with ``EngineConfig.add_cli_args``' flags) sets away
    from their defaults, by field name; ``skip`` names those the caller passes itself."""
    defaults = _engine_parser().parse_args([])
    out = {}
    for name, default in vars(defaults).items():
        value = getattr(args, name, default)
        if name in skip or value is None:
            continue
        same = (list(value) == list(default or ()) if isinstance(value, (list, tuple))
                else type(value) is type(default) and value == default)
        if not same:
            out[name] = value
    return out


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float, tail,
                 who: str, poll_s: float) -> None:
    """Poll ``base_url``/health until it answers 200; a ``RuntimeError`` with the log's tail
    (``tail()``) if the process exits first or ``timeout_s`` passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{who} exited with {proc.returncode}:\n{tail()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{who} was not healthy within {timeout_s}s:\n{tail()}")
        time.sleep(poll_s)


@contextlib.contextmanager
def local_server(model, dtype: str | None = None, device: str | None = None,
                 max_num_seqs: int | None = None, timeout_s: float = 180.0,
                 extra_args: tuple[str, ...] = ()):
    """``nanoserve serve`` on a free 127.0.0.1 port; yields a ``LocalServer`` (its base URL and
    pid) once healthy. ``dtype``, ``device`` and ``max_num_seqs`` become their engine flags;
    ``extra_args`` are more ``nanoserve serve`` flags.

    The server's output goes to a temporary log, shown if it dies or never turns healthy and
    readable through ``LocalServer.log`` while the block runs. On exit it gets SIGTERM, then
    SIGKILL if it has not stopped within 15 s; ``LocalServer.process.returncode`` then says how
    it ended.
    """

    port = free_port()
    cmd = [sys.executable, "-m", "nanoserve.cli", "serve", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port)]
    cmd += engine_argv({name: value for name, value in (("dtype", dtype), ("device", device),
                                                        ("max_num_seqs", max_num_seqs))
                        if value is not None})
    cmd += list(extra_args)
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})

        def read() -> str:
            log.flush()
            log.seek(0)
            return log.read()

        try:
            wait_healthy(proc, base_url, timeout_s, lambda: read()[-2000:], "the server",
                         poll_s=0.25)
            yield LocalServer(base_url, proc.pid, proc, read)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
