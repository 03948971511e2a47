"""Phi-3 (Phi-3-mini, Phi-3.5-mini, Phi-4-mini): Llama's layers with a partial rotary, a sliding
window and ``longrope`` scaling.

Why this module exists: a ``Phi3ForCausalLM`` checkpoint computes Llama's forward (RMSNorm,
SwiGLU, grouped-query attention, no biases) but for three things its config can set:

- ``partial_rotary_factor`` (Phi-4-mini: 0.75): RoPE turns only the first
  R = int(head_dim * factor) dims of each head, pairing i with i + R/2; the rest pass through
  (``layers.rotary.apply_rope`` reads R from the width of cos).
- ``sliding_window`` (Phi-3-mini-4k: 2047): every layer masks as Mistral's does, key j seen from
  position i iff i - window < j <= i (transformers' ``sliding_window_overlay``).
- ``longrope`` (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): each rotation frequency is divided by
  a factor of its own, from ``short_factor`` within the pretraining length
  ``original_max_position_embeddings`` and from ``long_factor`` beyond it, and cos and sin are
  multiplied by an ``attention_factor`` (by default sqrt(1 + ln(s) / ln(original)), s =
  max_position_embeddings / original).

The checkpoint stores ``qkv_proj`` and ``gate_up_proj`` fused, in nanoserve's own order, so they
load as they are (``model.weights``).

Which factors, once. transformers picks the list per forward from the longest position in it,
and vLLM per batch: either way a key cached while the sequence was short was turned by the short
factors and a key cached later by the long ones, so what a cached key holds depends on which
neighbours shared its forward (transformers even drops its cache when a sequence crosses the
boundary). Here the choice is static, as llama.cpp's: the long factors for the whole engine when
its ``max_model_len`` exceeds ``original_max_position_embeddings``, else the short ones, so a
key's rotation depends on its position alone, and prefix caching, chunked prefill and preemption
stay exact. It agrees with transformers on every sequence when ``max_model_len`` is within the
original length, and on sequences longer than it otherwise; a short sequence on a long engine
is turned by the long factors, where transformers would use the short.

The C++ forward (``cpu/fused.py``) reads the model's own cos and sin, so longrope's factors and
attention factor reach it; its ``rope_and_cache`` turns the whole head, so a partial rotary runs
its layers here (``fused_problem``). Tensor parallelism builds it as it builds Llama: tp/
cuts the fused q|k|v and gate|up tensors per head and per column, and each rank settles the
same RoPE factors from ``max_model_len``.

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"architectures": ["Phi3ForCausalLM"], "vocab_size": 32,
...     "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
...     "num_attention_heads": 4, "partial_rotary_factor": 0.75, "max_position_embeddings": 64,
...     "original_max_position_embeddings": 16, "rope_scaling": {"type": "longrope",
...     "short_factor": [1.0] * 6, "long_factor": [4.0] * 6}})
>>> Phi3.uses_long_factors(cfg, 64), Phi3.uses_long_factors(cfg, 16)
(True, False)
"""

from __future__ import annotations

from nanoserve.config import ModelConfig
from nanoserve.layers.rotary import (
    longrope_original,
    rope_attention_factor,
    rope_cos_sin,
    rope_inv_freq,
    rotary_dim,
)
from nanoserve.model.llama import LayerShape, Llama


class Phi3(Llama):
    model_type = "phi3"
    rope_types = ("longrope",)  # transformers' Phi3Config refuses any other scaling

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        w = cfg.sliding_window
        if w is not None and (not isinstance(w, int) or w < 1):
            raise ValueError(f"config.json: sliding_window={w!r}; a positive int or null")
        r = rotary_dim(cfg)
        if not 2 <= r <= cfg.head_dim or r % 2:
            raise ValueError(f"config.json: partial_rotary_factor turns {r} of head_dim="
                             f"{cfg.head_dim} dims; RoPE needs an even count from 2 to head_dim")
        s = cfg.rope_scaling
        if s is None:
            return
        if not longrope_original(cfg):
            raise ValueError("config.json: rope_scaling.rope_type='longrope' without "
                             "original_max_position_embeddings: where the long factors start")
        for key in ("short_factor", "long_factor"):
            f = s.get(key)
            if not isinstance(f, list) or len(f) != r // 2 or \
                    not all(isinstance(x, int | float) for x in f):
                raise ValueError(f"config.json: rope_scaling.{key}={f!r}; longrope needs "
                                 f"{r // 2} numbers, one per rotated pair")

    @classmethod
    def layer_shape(cls, cfg: ModelConfig) -> LayerShape:
        """No bias anywhere (transformers' Phi3 reads no ``attention_bias``)."""
        return LayerShape(qkv_bias=False, o_bias=False, mlp_bias=False)

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """``sliding_window`` on every layer (None, with ``sliding_window: null``)."""
        return (cfg.sliding_window,) * cfg.num_hidden_layers

    @classmethod
    def uses_long_factors(cls, cfg: ModelConfig, max_model_len: int) -> bool:
        """The static rule: longrope's long factors iff the engine serves sequences past the
        original pretraining length."""
        s = cfg.rope_scaling
        return s is not None and max_model_len > longrope_original(cfg)

    def __init__(self, cfg: ModelConfig, max_model_len: int | None = None):
        super().__init__(cfg, max_model_len)
        self.long_factors = self.uses_long_factors(cfg, self.max_model_len)
        self.rope_scale = rope_attention_factor(cfg)  # cos and sin times this
        self.inv_freq = rope_inv_freq(cfg, self.long_factors)  # (R/2,) over Llama's short ones
        if rotary_dim(cfg) < cfg.head_dim:
            self.fused_problem = (f"the C++ RoPE turns the whole head; this one turns "
                                  f"{rotary_dim(cfg)} of {cfg.head_dim} dims")

    def rope(self, positions, dtype):
        """positions (B, T) -> cos, sin (B, 1, T, R), longrope's attention factor applied."""
        return rope_cos_sin(self.inv_freq, positions, dtype, self.rope_scale)

    def finish_load(self, device) -> None:
        super().finish_load(device)
        self.inv_freq = rope_inv_freq(self.cfg, self.long_factors).to(device)
