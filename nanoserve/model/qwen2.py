"""Qwen2 (and Qwen2.5): Llama's layers with a bias on the q, k and v projections, none on o.

Why this module exists: a ``Qwen2ForCausalLM`` checkpoint computes Llama's forward but for those
three biases, so this family is Llama's classes with another ``LayerShape``, not a copy of them.
Its config turns biases on by architecture, not by key: Qwen2's ``attention_bias`` and
``mlp_bias`` are not read by transformers, so they are not read here either.

Sliding windows are read as transformers reads them: only where ``use_sliding_window`` is true,
on the layers ``layer_types`` marks ``sliding_attention`` where the config has that list (it
wins), else on every layer from ``max_window_layers`` on. A config that writes a window no layer
uses is served with full attention everywhere, as transformers serves it.

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 32,
...     "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3,
...     "num_attention_heads": 4, "use_sliding_window": True, "sliding_window": 8,
...     "max_window_layers": 1})
>>> Qwen2.layer_windows(cfg)
(None, 8, 8)
"""

from __future__ import annotations

from nanoserve.config import ModelConfig
from nanoserve.model.llama import LayerShape, Llama

LAYER_TYPES = ("full_attention", "sliding_attention")  # what a layer_types entry may say


def windowed_layers(cfg: ModelConfig) -> tuple[list[int], str]:
    """The layers transformers' Qwen2/Qwen3 window, and the key that says so."""
    d = cfg.extra
    if not d.get("use_sliding_window", False) or d.get("sliding_window") is None:
        return [], ""
    types = d.get("layer_types")
    if types is not None:
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"config.json: layer_types={types!r} names {unknown}; nanoserve "
                             f"reads full_attention and sliding_attention")
        windowed = LAYER_TYPES[1]
        return [i for i, t in enumerate(types) if t == windowed], \
            f"layer_types={types!r}"
    first = d.get("max_window_layers", 28)  # transformers' default
    return list(range(first, cfg.num_hidden_layers)), f"max_window_layers={first}"


def check_windows(cfg: ModelConfig) -> None:
    """A ``ValueError`` naming the key where the windows cannot be served as written: a
    ``layer_types`` entry this engine does not know, a list of the wrong length, or a window
    that is not a positive int."""
    layers, why = windowed_layers(cfg)  # refuses an unknown layer_types entry
    types = cfg.extra.get("layer_types")
    if types is not None and len(types) != cfg.num_hidden_layers:
        raise ValueError(f"config.json: layer_types has {len(types)} entries for "
                         f"num_hidden_layers={cfg.num_hidden_layers}")
    w = cfg.extra.get("sliding_window")
    if layers and (not isinstance(w, int) or w < 1):
        raise ValueError(f"config.json: sliding_window={w!r} ({why}); a positive int")


def qwen_layer_windows(cfg: ModelConfig) -> tuple[int | None, ...]:
    """Each layer's window: ``sliding_window`` on the layers ``windowed_layers`` names."""
    windowed = set(windowed_layers(cfg)[0])
    return tuple(cfg.extra["sliding_window"] if i in windowed else None
                 for i in range(cfg.num_hidden_layers))


class Qwen2(Llama):
    model_type = "qwen2"
    tensor_parallel = True  # biases split with their heads (tp/shard.py)

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        check_windows(cfg)

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """A window only on the layers transformers windows, not every layer as
        ``sliding_window`` alone would say."""
        return qwen_layer_windows(cfg)

    @classmethod
    def layer_shape(cls, cfg: ModelConfig) -> LayerShape:
        return LayerShape(qkv_bias=True, o_bias=False, mlp_bias=False)
