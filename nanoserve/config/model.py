"""Model configuration, read from a Hugging Face ``config.json``.

Why this module exists: every shape in the engine (heads, KV heads, head_dim, layers, vocab) and
every numerical constant (RMSNorm epsilon, RoPE base and scaling) comes from one file that the
checkpoint ships. Reading it in one place, validating it once, and freezing the result means the
model, the cache and the scheduler can never disagree about a shape.

Both spellings of RoPE settings are accepted: the classic ``rope_theta`` + ``rope_scaling`` keys
(Llama 3.x, SmolLM2, TinyLlama as published) and the ``rope_parameters`` dict that transformers 5
writes.

>>> cfg = ModelConfig.from_dict({"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
...     "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4})
>>> cfg.head_dim, cfg.num_key_value_heads, cfg.eos_token_ids
(4, 4, ())
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanoserve.config.text_config import text_model_dict

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "longrope")


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    """``eos_token_id`` may be an int, a list of ints, or absent."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor": ..., ...} or None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    architectures: tuple[str, ...] = ()  # the checkpoint's classes: the model registry's key
    model_type: str | None = None
    sliding_window: int | None = None  # a layer attends to its last N positions only
    attn_logit_softcapping: float | None = None  # scores pass through cap * tanh(s / cap)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = text_model_dict(d)  # a nested text_config lifted; a family's class defaults
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if not isinstance(d.get(key), int) or d[key] < 1:
                raise ValueError(f"config.json: {key} must be a positive int, got {d.get(key)!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(
                f"config.json: num_attention_heads={heads} is not a multiple of "
                f"num_key_value_heads={kv_heads}"
            )
        head_dim = d.get("head_dim") or d["hidden_size"] // heads

        # RoPE: transformers 5 nests everything in rope_parameters; older files use two keys.
        params = dict(d.get("rope_parameters") or {})
        if params and all(isinstance(v, dict) for v in params.values()):
            # keyed by layer type (Gemma 3): the full-attention layers' here, the rest the
            # family reads from ``extra``
            params = dict(params.get("full_attention") or {})
        theta = float(params.pop("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = dict(d.get("rope_scaling") or params or {}) or None
        if scaling is not None:
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"config.json: rope_scaling.rope_type={rope_type!r} is not supported "
                    f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
                )
            scaling["rope_type"] = rope_type
            if rope_type == "default":
                scaling = None

        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(d.get("eos_token_id")),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            architectures=tuple(d.get("architectures") or ()),
            model_type=d.get("model_type"),
            # Qwen2 and Qwen3 write a window size and switch it off with use_sliding_window
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window", True)
            else None,
            attn_logit_softcapping=d.get("attn_logit_softcapping"),
            extra=d,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"model folder {model_dir}: config.json is missing")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(d)

    def to_dict(self) -> dict:
        """The HF ``config.json`` for this model (what ``save_checkpoint`` writes)."""
        d = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
            "torch_dtype": self.torch_dtype,
        }
        return d
