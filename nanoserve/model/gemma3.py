"""Gemma 3 (the text model): Llama's attention and MLP inside another decoder layer.

Why this module exists: a ``Gemma3ForCausalLM`` checkpoint (and the language model of a
``Gemma3ForConditionalGeneration`` one) differs from Llama in ways a ``LayerShape`` alone cannot
say, so the family has its own layer and forward, built from Llama's ``Attention`` and ``MLP``:

- every RMSNorm scales by ``(1 + w)``, in float32, rounded once after (``GemmaRMSNorm``);
- four norms a layer: before and after attention, before and after the MLP, each output normed
  before it joins the residual;
- GeGLU: the MLP's gate goes through GELU's tanh approximation (``hidden_activation``);
- the embeddings are multiplied by sqrt(hidden), that scale first cast to the weights' dtype;
- per-head q and k norms (Gemma's kind), and scores scaled by ``query_pre_attn_scalar**-0.5``:
  the attention backends scale by ``head_dim**-0.5``, so q is multiplied by
  ``(head_dim / query_pre_attn_scalar)**0.5`` after RoPE (``LayerShape.q_scale``; 1, and
  skipped, where the two are equal as in the published 1B and 4B);
- local layers attend through a ``sliding_window`` (key j seen from i iff i - w < j <= i, as
  transformers' ``sliding_window_overlay``), global ones over everything, per ``layer_types``
  or, in older configs, ``sliding_window_pattern`` (every Nth layer global);
- local layers rotate with their own RoPE base: transformers 5 writes ``rope_parameters`` keyed
  by layer type; published configs write ``rope_theta`` and ``rope_scaling`` for the global
  layers and ``rope_local_base_freq`` (unscaled) for the local ones. Both are read;
- ``final_logit_softcapping``: logits pass through cap * tanh(logits / cap).

Refused by key: ``attn_logit_softcapping`` (Gemma 2's; no attention path here caps scores),
``use_bidirectional_attention``, an activation other than ``gelu_pytorch_tanh``, a
``layer_types`` entry other than full_attention and sliding_attention, and a final soft-cap on a
multimodal checkpoint (transformers' ``Gemma3ForConditionalGeneration`` never applies it, its
``ForCausalLM`` does: the published configs set none). The C++ forward cannot compute these
layers (``fused_problem``): where the ops are on they read attention and run the linears, the
layers run here. Tensor parallelism builds it as it builds Llama (its four norms a layer and
its q/k norms read whole on every rank, the embedding scale applied in the forward).

A ``Gemma3ForConditionalGeneration`` checkpoint serves text: its ``text_config`` is the config
(``config/text_config.py``), its language model's tensors are the weights, and its vision tower
and projector are not loaded (``weights.language_model_tensors`` logs how many).

Numbers: against transformers in float32 a prompt's logits are bit-identical where
``query_pre_attn_scalar`` is head_dim times a power of 4 (q's factor is then a power of two);
otherwise q's factor rounds and scores move in their last bit (measured 1.9e-6 on logits of
about 4 in the 4-layer test model, for 24 and for 168 with head_dim 32; transformers' own
cached decode differs from its full recompute by up to 5e-6 on the same model; nanoserve's
decode logits differ from transformers' by at most 3e-6 there).

>>> from nanoserve.config import ModelConfig
>>> cfg = ModelConfig.from_dict({"architectures": ["Gemma3ForCausalLM"],
...     "model_type": "gemma3_text", "vocab_size": 32, "hidden_size": 16,
...     "intermediate_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
...     "sliding_window": 8, "sliding_window_pattern": 3})
>>> Gemma3.layer_windows(cfg)
(8, 8, None, 8, 8, None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.config import ModelConfig
from nanoserve.layers.norm import GemmaRMSNorm
from nanoserve.layers.rotary import rope_cos_sin, rope_inv_freq
from nanoserve.model.llama import MLP, Attention, LayerShape, Llama

FULL, LOCAL = "full_attention", "sliding_attention"  # the layer_types entries read
ACTIVATIONS = {"gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}
DEFAULT_THETA = {FULL: 1_000_000.0, LOCAL: 10_000.0}  # Gemma3TextConfig's bases
ROPE_TYPES = ("linear", "llama3")  # beside "default": what rope_inv_freq computes


def activation(cfg: ModelConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP's gate activation (``hidden_activation``), or a ``ValueError`` naming it."""
    act = cfg.extra.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise ValueError(f"config.json: hidden_activation={act!r}; Gemma 3 is served with "
                         f"{', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def layer_types(cfg: ModelConfig) -> list[str]:
    """Each layer's type: ``layer_types`` where written, else every ``sliding_window_pattern``-th
    layer global (transformers' rule for configs from before ``layer_types``)."""
    d, n = cfg.extra, cfg.num_hidden_layers
    types = d.get("layer_types")
    if types is None:
        every = d.get("sliding_window_pattern", 6)
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"config.json: sliding_window_pattern={every!r}; a positive int")
        return [LOCAL if (i + 1) % every else FULL for i in range(n)]
    unknown = sorted(set(types) - {FULL, LOCAL})
    if unknown:
        raise ValueError(f"config.json: layer_types={types!r} names {unknown}; nanoserve reads "
                         f"{FULL} and {LOCAL}")
    if len(types) != n:
        raise ValueError(f"config.json: layer_types has {len(types)} entries for "
                         f"num_hidden_layers={n}")
    return list(types)


def _scaling(key: str, params: dict | None) -> dict | None:
    """A rope_scaling dict with its type checked (None for the default rotation)."""
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_TYPES:
        raise ValueError(f"config.json: {key}.rope_type={kind!r}; nanoserve computes default, "
                         f"{', '.join(ROPE_TYPES)}")
    return {**params, "rope_type": kind}


def rope_by_type(cfg: ModelConfig) -> dict[str, tuple[float, dict | None]]:
    """Layer type -> (RoPE base, scaling or None), from either spelling."""
    d = cfg.extra
    params = d.get("rope_parameters")
    if params:
        if not all(isinstance(params.get(t), dict) for t in (FULL, LOCAL)):
            raise ValueError(f"config.json: rope_parameters={params!r}; Gemma 3 keys it by "
                             f"layer type ({FULL}, {LOCAL})")
        return {t: (float(params[t].get("rope_theta", DEFAULT_THETA[t])),
                    _scaling(f"rope_parameters.{t}", params[t])) for t in (FULL, LOCAL)}
    # the published spelling: the scaling is the global layers' only
    return {FULL: (float(d.get("rope_theta", DEFAULT_THETA[FULL])),
                   _scaling("rope_scaling", d.get("rope_scaling"))),
            LOCAL: (float(d.get("rope_local_base_freq", DEFAULT_THETA[LOCAL])), None)}


def gemma_inv_freqs(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Layer type -> its D/2 rotation frequencies, as ``rope_inv_freq`` computes Llama's."""
    return {t: rope_inv_freq(dataclasses.replace(cfg, rope_theta=theta, rope_scaling=scaling))
            for t, (theta, scaling) in rope_by_type(cfg).items()}


class GemmaDecoderLayer(nn.Module):
    """Each sublayer's input normed before it and its output normed before the residual."""

    def __init__(self, cfg: ModelConfig, layer: int, shape: LayerShape):
        super().__init__()
        e, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(e, eps)
        self.self_attn = Attention(cfg, layer, shape)
        self.post_attention_layernorm = GemmaRMSNorm(e, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(e, eps)
        self.mlp = MLP(cfg, shape.mlp_bias, activation(cfg))
        self.post_feedforward_layernorm = GemmaRMSNorm(e, eps)

    def forward(self, x, cos, sin, positions, backend):
        h = self.self_attn(self.input_layernorm(x), cos, sin, positions, backend)  # (B, T, E)
        x = x + self.post_attention_layernorm(h)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3(Llama):
    model_type = "gemma3_text"
    fused_problem = ("the C++ forward has no Gemma layer ((1 + w) norms, four a layer, GeGLU, "
                     "two RoPE bases)")
    tensor_parallel = True  # its linears carry their split; its norms are read whole
    layer_class = GemmaDecoderLayer
    norm_class = GemmaRMSNorm

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        d = cfg.extra
        if d.get("attn_logit_softcapping") is not None:
            raise ValueError(f"config.json: attn_logit_softcapping="
                             f"{d['attn_logit_softcapping']}; no attention path in nanoserve "
                             "soft-caps scores")
        if d.get("use_bidirectional_attention"):
            raise ValueError("config.json: use_bidirectional_attention=True; nanoserve serves "
                             "causal attention only")
        if LOCAL in layer_types(cfg):
            w = cfg.sliding_window
            if not isinstance(w, int) or w < 1:
                raise ValueError(f"config.json: sliding_window={w!r} with {LOCAL} layers; "
                                 "a positive int")
        if d.get("vision_config") is not None and d.get("final_logit_softcapping") is not None:
            raise ValueError(f"config.json: text_config.final_logit_softcapping="
                             f"{d['final_logit_softcapping']} on a multimodal checkpoint: "
                             "transformers' Gemma3ForConditionalGeneration does not apply it and "
                             "Gemma3ForCausalLM does; refused rather than guessed")
        rope_by_type(cfg)

    @classmethod
    def activation(cls, cfg: ModelConfig) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation(cfg)

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """``sliding_window`` on the local layers, None on the global ones."""
        return tuple(cfg.sliding_window if t == LOCAL else None for t in layer_types(cfg))

    @classmethod
    def layer_shape(cls, cfg: ModelConfig) -> LayerShape:
        scalar = cfg.extra.get("query_pre_attn_scalar", 256)
        return LayerShape(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias,
                          mlp_bias=False, qk_norm=True, qk_norm_class=GemmaRMSNorm,
                          q_scale=(cfg.head_dim / scalar) ** 0.5)

    def __init__(self, cfg: ModelConfig, max_model_len: int | None = None):
        super().__init__(cfg, max_model_len)
        self.types = layer_types(cfg)
        self.final_softcap = cfg.extra.get("final_logit_softcapping")
        self._rope_buffers(cfg)

    def _rope_buffers(self, cfg: ModelConfig, device: torch.device | str | None = None):
        """The global (``inv_freq``) and local (``local_inv_freq``) frequencies, and the
        embedding scale, in float32 as transformers keeps its buffers."""
        freqs = gemma_inv_freqs(cfg)
        self.register_buffer("inv_freq", freqs[FULL].to(device), persistent=False)
        self.register_buffer("local_inv_freq", freqs[LOCAL].to(device), persistent=False)
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5, device=device),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                backend=None) -> torch.Tensor:
        """input_ids, positions (B, T) -> hidden (B, T, E); no ``backend``: no cache."""
        if backend is None:
            backend = self.causal
        x = self.embed_tokens(input_ids)  # (B, T, E)
        x = x * self.embed_scale.to(x.dtype)
        freqs = {FULL: self.inv_freq, LOCAL: self.local_inv_freq}
        rope = {t: rope_cos_sin(freqs[t], positions, x.dtype)  # (B, 1, T, D) each
                for t in set(self.types)}
        for layer, t in zip(self.layers, self.types, strict=True):
            x = layer(x, *rope[t], positions, backend)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., E) -> logits (..., V), soft-capped where the config says, in float32."""
        logits = self.lm_head(hidden)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits.float()

    def finish_load(self, device: torch.device | str) -> None:
        self.tie_weights()
        self._rope_buffers(self.cfg, device)
