"""Llama, written out: RMSNorm, RoPE (with ``llama3`` scaling), grouped-query attention, SwiGLU.

Why this module exists: it is the one forward pass everything else serves. It is written to match
Hugging Face's ``LlamaForCausalLM`` operation for operation (RMSNorm in fp32, RoPE as
``rotate_half``, the same ``inv_freq`` arithmetic) so that tests can hold its logits against
transformers' on the same checkpoint (bit-identical in fp32 on the CPUs tested).

The model does not own a KV cache. Attention asks the *attention context* it is given for the
context of its queries: with none it attends causally over the tokens it was given (the uncached
path of Day 4, ``CausalAttention``); with a ``KVCache`` (Day 7) it first writes the new keys and
values, then attends over everything cached. Later days plug the paged cache (and through it an
attention backend) into the same seam.

Shapes: B batch, T new tokens, S attended tokens, Hq query heads, Hkv KV heads, D head_dim,
E hidden size, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.attention.causal import CausalAttention
from nanoserve.config import ModelConfig
from nanoserve.layers.linear import Linear
from nanoserve.layers.norm import RMSNorm
from nanoserve.layers.rotary import apply_rope, rope_cos_sin, rope_inv_freq


class AttentionContext(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D), k/v (B, Hkv, T, D) for the new tokens -> (B, Hq, T, D)."""
        ...


@dataclass(frozen=True, slots=True)
class LayerShape:
    """Where a family's decoder layer differs from Llama's: which linears carry a bias,
    whether q and k pass through an RMSNorm per head (over D) before RoPE (Qwen3), of which
    class (Gemma's scales by 1 + w), and a factor on q before attention, whose backends all
    scale scores by D**-0.5 (Gemma's ``query_pre_attn_scalar`` asks for another scale)."""

    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool = False
    qk_norm_class: type[nn.Module] = RMSNorm
    q_scale: float = 1.0


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shape: LayerShape):
        super().__init__()
        self.layer = layer
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size,
                               bias=shape.qkv_bias, parallel="column")
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=shape.o_bias, parallel="row")
        if shape.qk_norm:
            self.q_norm = shape.qk_norm_class(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = shape.qk_norm_class(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = shape.qk_norm
        self.q_scale = shape.q_scale

    def forward(self, x, cos, sin, positions, backend: AttentionContext):
        B, T, _ = x.shape  # (B, T, E)
        q, k, v = self.qkv_proj(x).split([self.hq * self.d, self.hkv * self.d,
                                          self.hkv * self.d], dim=-1)
        q = q.view(B, T, self.hq, self.d)  # (B, T, Hq, D)
        k = k.view(B, T, self.hkv, self.d)  # (B, T, Hkv, D)
        if self.qk_norm:  # each head's q and k normalised over D, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, Hq, T, D), (B, Hkv, T, D)
        v = v.view(B, T, self.hkv, self.d).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_scale != 1.0:  # scores are then q.k * q_scale * D**-0.5
            q = q * self.q_scale
        out = backend.attend(self.layer, q, k, v, positions)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.hq * self.d))


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with ``F.silu``, GeGLU with a GELU."""

    def __init__(self, cfg: ModelConfig, bias: bool,
                 act: Callable[[torch.Tensor], torch.Tensor] = F.silu):
        super().__init__()
        self.i = cfg.intermediate_size
        self.act = act
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.i, bias=bias, parallel="column")
        self.down_proj = Linear(self.i, cfg.hidden_size, bias=bias, parallel="row")

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.i, dim=-1)  # (B, T, I) each
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shape: LayerShape):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, shape)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, shape.mlp_bias)

    def forward(self, x, cos, sin, positions, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """``forward`` gives final hidden states; ``compute_logits`` applies the LM head.

    Keeping the two apart lets generation project only the positions it samples from: a prompt
    of T tokens needs one (E x V) matmul row, not T.
    """

    model_type = "llama"  # the config.json model_type this family reads
    # What the C++ forward (cpu/fused.py) cannot compute for this family, or None: where it is
    # set, the ops still read attention and run the linears, but the layers run here.
    fused_problem: str | None = None
    tensor_parallel = True  # whether tp/ builds this family (TPLlama is a Llama)
    rope_types = ("linear", "llama3")  # the rope_scaling types it computes (registry refuses)
    layer_class: type[nn.Module] = DecoderLayer  # a family with other layers names its own
    norm_class: type[nn.Module] = RMSNorm  # the final norm's

    @classmethod
    def activation(cls, cfg: ModelConfig) -> Callable[[torch.Tensor], torch.Tensor]:
        """The MLP's activation as ``config.json`` names it (``hidden_act``; Llama's is silu),
        or a ``ValueError`` naming the key and its value: each family reads its own key."""
        act = cfg.extra.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json: hidden_act={act!r}; {cls.__name__} uses 'silu'")
        return F.silu

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        """Refuse (``ValueError`` naming the key and its value) what this family reads from
        ``config.json`` and cannot honour. Llama's layers attend over the whole context
        (transformers' Llama has no window and ignores the key), so a ``sliding_window`` on a
        Llama checkpoint is refused rather than guessed at either way."""
        if cfg.sliding_window is not None:
            raise ValueError(f"config.json: sliding_window={cfg.sliding_window} on a Llama "
                             "checkpoint: Llama's layers attend over the whole context; a "
                             "windowed model is MistralForCausalLM")

    @classmethod
    def layer_shape(cls, cfg: ModelConfig) -> LayerShape:
        """The biases and norms of this family's layers, as its config sets them."""
        return LayerShape(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias,
                          mlp_bias=cfg.mlp_bias)

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """Each layer's sliding window (a key j is seen from position i iff i - w < j <= i),
        None for full attention: every layer of a Llama attends over the whole context."""
        return (None,) * cfg.num_hidden_layers

    @classmethod
    def served_windows(cls, cfg: ModelConfig, max_model_len: int) -> tuple[int | None, ...]:
        """``layer_windows`` as the engine serves them: a window no shorter than
        ``max_model_len`` hides nothing any query can reach (i - w < 0 <= j for every i the
        engine runs), so it is full attention. Phi-3.5-mini and Phi-4-mini publish a window
        of 262,144 tokens over a context of 131,072."""
        return tuple(None if w is not None and w >= max_model_len else w
                     for w in cls.layer_windows(cfg))

    def __init__(self, cfg: ModelConfig, max_model_len: int | None = None):
        super().__init__()
        self.cfg = cfg
        # the engine's longest sequence (the loader's); a RoPE that depends on it reads it
        self.max_model_len = max_model_len or cfg.max_position_embeddings
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        shape = self.layer_shape(cfg)
        self.layers = nn.ModuleList(self.layer_class(cfg, i, shape)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = self.norm_class(cfg.hidden_size, cfg.rms_norm_eps)
        tied = cfg.tie_word_embeddings  # its weight is the embedding's: nothing to initialise
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False,
                              device="meta" if tied else None)
        self.tie_weights()
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.windows = self.served_windows(cfg, self.max_model_len)  # each layer's, or None
        self.causal = CausalAttention(self.windows)  # the attention context with no cache
        # What ``prepare_model`` settles at load (nanoserve/model/prepare.py), declared here:
        self.huge_pages = "weights not packed"  # where the small-M copies live (cpu/huge_pages)
        self.fused_forward = None  # the C++ forward (cpu/fused.py) where the ops are on
        self.decode_layer_weights = None  # its layer loop as one op, where every linear allows

    def tie_weights(self) -> None:
        """A tied LM head reads the embedding's own weight (one Parameter, counted once)."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                backend: AttentionContext | None = None) -> torch.Tensor:
        """input_ids, positions (B, T) -> hidden (B, T, E); no ``backend``: no cache."""
        if backend is None:
            backend = self.causal
        if self.fused_forward is not None:
            return self.fused_forward(self, input_ids, positions, backend)
        x = self.embed_tokens(input_ids)  # (B, T, E)
        cos, sin = self.rope(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, backend)
        return self.norm(x)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions (B, T) -> cos, sin (B, 1, T, D): this family's rotation angles."""
        return rope_cos_sin(self.inv_freq, positions, dtype)

    @property
    def kernels(self) -> bool:
        """Whether forward runs through the C++ ops."""
        return self.fused_forward is not None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., E) -> logits (..., V), in float32 for the sampler."""
        return self.lm_head(hidden).float()

    def num_parameters(self) -> int:
        """The checkpoint's parameters, a packed linear (whose method holds the only copy of
        its weight) counted by its shape."""
        released = sum(m.in_features * m.out_features for m in self.modules()
                       if isinstance(m, Linear) and m.weight is None)
        return sum(p.numel() for p in self.parameters()) + released

    def finish_load(self, device: torch.device | str) -> None:
        """What this family rebuilds once its weights are assigned: the tied head, and the
        rotary frequencies, computed on ``device`` as transformers computes them."""
        self.tie_weights()
        self.inv_freq = rope_inv_freq(self.cfg).to(device)
