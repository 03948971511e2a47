"""Qwen3 (dense): Llama's layers with an RMSNorm on each head's q and k, over head_dim, before
RoPE.

Why this module exists: a ``Qwen3ForCausalLM`` checkpoint differs from Llama in that norm (its
``q_norm`` and ``k_norm`` tensors, one (D,) weight each per layer), in a ``head_dim`` that is
usually not hidden / heads (read by ``ModelConfig``), and in an ``attention_bias`` that puts a
bias on q, k, v and o alike; the MLP never has one (transformers reads no ``mlp_bias`` here).

The C++ forward (``cpu/fused.py``, its decode loop in csrc) has no per-head norm, so where the
ops are on they read attention and run the linears while the layers run here
(``fused_problem``). Sliding windows are read as Qwen2 reads them.
"""

from __future__ import annotations

from nanoserve.config import ModelConfig
from nanoserve.model.llama import LayerShape, Llama
from nanoserve.model.qwen2 import check_windows, qwen_layer_windows


class Qwen3(Llama):
    model_type = "qwen3"
    fused_problem = "the C++ forward has no per-head q/k RMSNorm"
    tensor_parallel = True  # q/k norms (D,) replicated, biases split with their heads

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        check_windows(cfg)

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        return qwen_layer_windows(cfg)

    @classmethod
    def layer_shape(cls, cfg: ModelConfig) -> LayerShape:
        return LayerShape(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias,
                          mlp_bias=False, qk_norm=True)
