"""The attention option's registry: each name, and the backend class that reads that way.

Why this module exists: ``--attention`` is checked when a config is made, so the names live
where the config can read them, and the classes are named, not imported, so that a config never
loads a kernel. ``nanoserve.attention.selector`` turns a name into its class. A new read path is
one file under ``nanoserve/attention/backends/`` and one line here.
"""

from __future__ import annotations

ATTENTION_BACKENDS = {  # option value -> "module:Class"
    "reference": "nanoserve.attention.backends.reference:ReferenceBackend",  # Day 28
    "gathered": "nanoserve.attention.backends.gathered:GatheredBackend",  # Day 50
    "triton": "nanoserve.attention.backends.triton:TritonBackend",  # Week 14
    "cpu": "nanoserve.attention.backends.cpu:CPUBackend",  # Day 55
}
ATTENTION_PATHS = tuple(ATTENTION_BACKENDS)
ATTENTION_CHOICES = ("auto", *ATTENTION_PATHS)  # auto: the C++ kernel where the ops load
