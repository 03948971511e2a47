"""Triton's mode, compiler or interpreter, chosen by the caller before triton is first imported.

Why this module exists: on a machine without CUDA, Triton's kernels run only under its
interpreter, and Triton chooses between interpreter and compiler each time ``@triton.jit`` runs.
Its own helpers (``tl.cdiv``, ``tl.sigmoid``, ...) are decorated when ``import triton`` runs, so
``TRITON_INTERPRET=1`` has to be in the environment before the first triton import anywhere in
the process. That is earlier than it looks: torch imports triton itself, through dynamo, the
first time a module is built under ``torch.device("meta")``, which is how ``weights.load_model``
builds the model. Set any later, the kernels would be interpreted and the helpers they call
compiled.

Importing a library must not change the process environment, so ``nanoserve.cuda.kernels`` never
sets the variable: on import it only checks (``require_choice``, ``require_one_mode``) and
refuses, saying what to set. The choice is the caller's, made in one of two ways:

- in the environment: ``TRITON_INTERPRET=1 python ...``. ``TRITON_INTERPRET=0`` keeps the
  compiler on a CPU, which is what ``tools/kernel_aot.py`` needs. ``tests/conftest.py`` and
  ``chapters/runner.py`` set it for the processes they run;
- by calling ``use_interpreter()`` at a named moment, before anything imports triton: an engine
  built with ``attention="triton"`` does before it builds the model, and so does a notebook that
  runs the kernel.

This module imports torch (to ask whether there is CUDA), and triton only in
``require_one_mode``, which runs after triton has been imported.
"""

from __future__ import annotations

import os
import sys

import torch

VARIABLE = "TRITON_INTERPRET"
HOW = (f"set {VARIABLE}=1 in the environment, or call "
       f"nanoserve.cuda.triton_mode.use_interpreter(), before anything imports triton "
       f"({VARIABLE}=0 keeps the compiler)")


def chosen() -> bool:
    """Has this process a mode for Triton's kernels? With CUDA the compiler is the default;
    without it, someone has to have set ``TRITON_INTERPRET``."""
    return VARIABLE in os.environ or torch.cuda.is_available()


def use_interpreter() -> None:
    """Choose Triton's interpreter for this process when there is no CUDA and nobody chose.

    A caller's choice stands (``TRITON_INTERPRET`` set to anything, ``0`` included), and with
    CUDA nothing changes. Refuses (``RuntimeError``) when the interpreter is needed but triton is
    already imported: its helpers were built for the compiler, and setting the variable now would
    not rebuild them."""
    if chosen():
        return
    if "triton" in sys.modules:
        raise RuntimeError(f"no CUDA here, and triton was imported before {VARIABLE} was set, so "
                           f"its own @jit helpers were built for a compiler that cannot run "
                           f"here: set {VARIABLE}=1 before the first triton import")
    os.environ[VARIABLE] = "1"


def require_choice() -> None:
    """What ``nanoserve.cuda.kernels`` asks before it imports triton: a mode must have been chosen.
    Never sets anything (``ImportError`` otherwise)."""
    if not chosen():
        raise ImportError(f"nanoserve.cuda.kernels: there is no CUDA here, so Triton's kernels can "
                          f"only run under its interpreter, which must be chosen before triton "
                          f"is first imported: {HOW}")


def require_one_mode(kernel) -> None:
    """Refuse a kernel decorated in another mode than triton's own helpers: the variable was
    set, or changed, after triton was imported (``ImportError``)."""
    import triton.language.standard as standard

    ours, theirs = type(kernel).__name__, type(standard.cdiv).__name__
    if ours != theirs:
        raise ImportError(f"nanoserve.cuda.kernels: the kernels were decorated as {ours} but "
                          f"triton's own helpers as {theirs}: {VARIABLE} was set or changed "
                          f"after triton was first imported; {HOW}")
