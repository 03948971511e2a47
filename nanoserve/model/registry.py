"""The model registry: a checkpoint's ``architectures`` name the family that builds it.

Why this module exists: a Hugging Face ``config.json`` says which class wrote it
(``"architectures": ["LlamaForCausalLM"]``), and that, not a guess from its shapes, decides which
forward serves it. Each family is one module under ``nanoserve/model/`` and one line here; a
checkpoint of any other architecture is refused before a byte of it is read, with the list of
the ones that are served.

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 32,
...     "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
...     "num_attention_heads": 4})
>>> model_class(cfg).__name__
'Llama'
"""

from __future__ import annotations

from nanoserve.config import ModelConfig
from nanoserve.config.registries import load_class

MODEL_FAMILIES = {  # a config's architectures entry -> the family's "module:Class"
    "LlamaForCausalLM": "nanoserve.model.llama:Llama",  # Llama 3.x, SmolLM2, TinyLlama, ours
    "Qwen2ForCausalLM": "nanoserve.model.qwen2:Qwen2",  # Qwen2, Qwen2.5: biased q, k, v
    "Qwen3ForCausalLM": "nanoserve.model.qwen3:Qwen3",  # Qwen3 dense: per-head q/k norms
    "MistralForCausalLM": "nanoserve.model.mistral:Mistral",  # Llama, every layer windowed
    "Phi3ForCausalLM": "nanoserve.model.phi3:Phi3",  # Phi-3, 3.5, 4-mini: partial rotary, longrope
    "Gemma3ForCausalLM": "nanoserve.model.gemma3:Gemma3",  # Gemma 3 1B and the text models
    "Gemma3ForConditionalGeneration": "nanoserve.model.gemma3:Gemma3",  # its language model
}


def model_class(cfg: ModelConfig) -> type:
    """The class that serves ``cfg``: its first registered architecture, or a family whose
    ``model_type`` it names where the config lists no architecture; else a ``ValueError``
    naming what is supported. The family then checks the keys only it reads
    (``check_config``, and its MLP's ``activation``), and a RoPE scaling it does not compute
    (``rope_types``) is refused: what it cannot honour is refused here, before a weight is
    read."""
    cls = _find(cfg)
    rope_type = (cfg.rope_scaling or {}).get("rope_type")
    if rope_type is not None and rope_type not in cls.rope_types:
        raise ValueError(f"config.json: rope_scaling.rope_type={rope_type!r} on "
                         f"{cls.__name__}: it computes {', '.join(cls.rope_types)}")
    cls.check_config(cfg)
    cls.activation(cfg)
    return cls


def _find(cfg: ModelConfig) -> type:
    for arch in cfg.architectures:
        if arch in MODEL_FAMILIES:
            return load_class(MODEL_FAMILIES[arch])
    families = {arch: load_class(path) for arch, path in MODEL_FAMILIES.items()}
    if not cfg.architectures:
        for cls in families.values():
            if cls.model_type == cfg.model_type:
                return cls
    served = ", ".join(f"{cls.__name__} ({arch})" for arch, cls in families.items())
    raise ValueError(f"config.json: model_type={cfg.model_type!r}, architectures="
                     f"{list(cfg.architectures)!r}; nanoserve supports only {served}")
