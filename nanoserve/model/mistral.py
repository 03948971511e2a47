"""Mistral: Llama's layers, every one attending through a sliding window of ``sliding_window``.

Why this module exists: a ``MistralForCausalLM`` checkpoint computes Llama's forward but for its
attention mask: a key at position j is visible from position i iff ``i - sliding_window < j <= i``
(transformers' ``sliding_window_overlay``), on every layer; ``sliding_window: null`` is plain
Llama. The window is each layer's (``Llama.layer_windows``) and every attention path reads it:
the reference and gathered backends mask by absolute position, the C++ and Triton kernels
start each row's read at its first visible block, graph windows pass it to the replayed read,
and where every layer is windowed the KV manager gives back blocks that left it (Day 70).

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"architectures": ["MistralForCausalLM"], "vocab_size": 32,
...     "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
...     "num_attention_heads": 4, "sliding_window": 8})
>>> Mistral.layer_windows(cfg)
(8, 8)
"""

from __future__ import annotations

from nanoserve.config import ModelConfig
from nanoserve.model.llama import Llama


class Mistral(Llama):
    model_type = "mistral"
    tensor_parallel = True  # each rank's cache reads the same layer_windows

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        w = cfg.sliding_window
        if w is not None and (not isinstance(w, int) or w < 1):
            raise ValueError(f"config.json: sliding_window={w!r}; a positive int or null")

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """``sliding_window`` on every layer (None, with ``sliding_window: null``, is Llama)."""
        return (cfg.sliding_window,) * cfg.num_hidden_layers
