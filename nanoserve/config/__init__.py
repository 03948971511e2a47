"""The two configurations: what the checkpoint is, and how the engine runs it.

Why this package exists: every shape comes from the checkpoint's ``config.json``
(``ModelConfig``, ``config/model.py``), and every engine option comes from one frozen dataclass
(``EngineConfig``, ``engine.py``) that ``LLM``, ``AsyncLLM``, ``nanoserve serve`` and the
benchmarks all build from. Nothing else lists an option, its default or its limit. The attention
and batching options' names, and the class each names, are ``registries.py``; ``cpus.py`` is the
syntax of ``threads_bind``.

May import: nothing else of nanoserve; it is the bottom of the layers.
"""

from __future__ import annotations

from nanoserve.config.engine import (
    ALLOCATION_POLICIES,
    DEFAULT_MODEL,
    KERNEL_CHOICES,
    PREFILL_POLICIES,
    PREPACK_CHOICES,
    ConfigError,
    EngineConfig,
)
from nanoserve.config.model import ModelConfig, _as_id_tuple
from nanoserve.config.registries import (
    ATTENTION_CHOICES,
    ATTENTION_PATHS,
    BATCHING_POLICIES,
)

__all__ = ["ALLOCATION_POLICIES", "ATTENTION_CHOICES", "ATTENTION_PATHS", "BATCHING_POLICIES",
           "DEFAULT_MODEL", "KERNEL_CHOICES", "PREFILL_POLICIES", "PREPACK_CHOICES", "ConfigError",
           "EngineConfig", "ModelConfig", "_as_id_tuple"]
