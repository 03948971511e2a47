"""Triton's mode is the caller's choice: importing ``nanoserve.cuda.kernels`` never writes the
environment, it refuses until someone chose, and ``use_interpreter`` refuses once it is too late.

Each case runs in a fresh interpreter without ``TRITON_INTERPRET`` (this session's conftest set
it here), on a machine without CUDA, which is where the choice matters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU semantics: no CUDA")

ROOT = Path(__file__).resolve().parents[1]


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=300)


def test_importing_the_kernels_refuses_and_writes_nothing():
    r = run("""
        import os
        try:
            import nanoserve.cuda.kernels
        except ImportError as e:
            print("refused:", e)
        print("env:", os.environ.get("TRITON_INTERPRET"))
        """)
    assert r.returncode == 0, r.stderr
    assert "refused: nanoserve.cuda.kernels: there is no CUDA here" in r.stdout
    assert "set TRITON_INTERPRET=1" in r.stdout and "env: None" in r.stdout


def test_use_interpreter_then_the_kernels_run_interpreted():
    r = run("""
        import os
        from nanoserve.cuda.triton_mode import use_interpreter
        use_interpreter()
        import nanoserve.cuda.kernels
        from nanoserve.cuda.kernels.paged_attention import _paged_attention_kernel as k
        print(os.environ["TRITON_INTERPRET"], type(k).__name__)
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "InterpretedFunction"]


def test_a_callers_choice_stands():
    r = run("""
        import os
        from nanoserve.cuda.triton_mode import use_interpreter
        use_interpreter()
        import nanoserve.cuda.kernels
        print(os.environ["TRITON_INTERPRET"])
        """, TRITON_INTERPRET="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]


def test_too_late_is_refused():
    r = run("""
        import os
        import triton
        from nanoserve.cuda.triton_mode import use_interpreter
        try:
            use_interpreter()
        except RuntimeError as e:
            print("refused:", e)
        os.environ["TRITON_INTERPRET"] = "1"  # set by hand, after triton: mixed modes
        try:
            import nanoserve.cuda.kernels
        except ImportError as e:
            print("mixed:", e)
        """)
    assert r.returncode == 0, r.stderr
    assert "refused: no CUDA here, and triton was imported before TRITON_INTERPRET" in r.stdout
    assert "mixed: nanoserve.cuda.kernels: the kernels were decorated as InterpretedFunction but " \
           "triton's own helpers as JITFunction" in r.stdout
