"""The options whose choices are classes: each name, and the class that name means.

Why this module exists: ``--attention`` and ``--batching`` are checked when a config is made, so
their names live where the config can read them; the classes are named, not imported, so that a
config loads no kernel and no scheduler. ``load_class`` turns a name into its class, for the
part that uses it (``nanoserve.attention.selector``, ``nanoserve.engine.core``). A new read path
or a new batching policy is one file in its part and one line here.

>>> load_class(BATCHING_POLICIES["static"]).__name__
'WaveScheduler'
"""

from __future__ import annotations

import importlib

ATTENTION_BACKENDS = {  # --attention: option value -> "module:Class"
    "reference": "nanoserve.attention.backends.reference:ReferenceBackend",  # Day 28
    "gathered": "nanoserve.attention.backends.gathered:GatheredBackend",  # Day 50
    "triton": "nanoserve.attention.backends.triton:TritonBackend",  # Week 14
    "cpu": "nanoserve.attention.backends.cpu:CPUBackend",  # Day 55
}
ATTENTION_PATHS = tuple(ATTENTION_BACKENDS)
ATTENTION_CHOICES = ("auto", *ATTENTION_PATHS)  # auto: the C++ kernel where the ops load

BATCHING_POLICIES = {  # --batching: option value -> the scheduler class that runs it
    "continuous": "nanoserve.engine.scheduler:Scheduler",  # Day 31
    "static": "nanoserve.engine.waves:WaveScheduler",  # Day 29
}


def load_class(path: str) -> type:
    """``"package.module:Class"`` -> the class, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
