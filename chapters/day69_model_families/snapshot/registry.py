"""Day 69 snapshot (frozen): a config.json names its family, and the family says how it differs.

The engine has one forward pass. What a family changes is answered by a few class-level hooks
that read the config and return plain values: which linears carry a bias, whether q and k are
normed per head, which layers attend through a window, which RoPE scalings it computes. The
registry maps a checkpoint's ``architectures`` entry to a family, refuses any other with the
list it serves, and lets the family refuse what it cannot honour, all before a weight is read.
This copy reads a ``config.json`` dict and returns decisions only: no torch, no layers.

>>> cfg = {"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 6, "head_dim": 256,
...        "sliding_window": 512}
>>> fam = family(cfg)
>>> fam.__name__, fam.windows(cfg), fam.rope_bases(cfg)[:2]
('Gemma3', (512, 512, 512, 512, 512, None), (10000.0, 10000.0))
>>> qwen = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 3,
...         "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
>>> family(qwen).windows(qwen)
(None, 8, 8)
>>> family({"architectures": ["GemmaForCausalLM"]})
Traceback (most recent call last):
...
ValueError: architectures=['GemmaForCausalLM']; served: LlamaForCausalLM, Qwen2ForCausalLM, \
Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM, \
Gemma3ForConditionalGeneration
>>> family({"architectures": ["Gemma3ForCausalLM"], "attn_logit_softcapping": 50.0})
Traceback (most recent call last):
...
ValueError: attn_logit_softcapping=50.0: no attention path soft-caps scores
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, LOCAL = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class LayerShape:
    """Where a decoder layer differs from Llama's, as data."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # an RMSNorm over head_dim on each head's q and k, before RoPE
    one_plus_w: bool = False  # norms scale by (1 + w) in float32 (Gemma)
    q_scale: float = 1.0  # scores are q.k * q_scale * head_dim**-0.5


class Llama:
    rope_types = ("linear", "llama3")

    @classmethod
    def check(cls, cfg: dict) -> None:
        if cfg.get("sliding_window") is not None:
            raise ValueError(f"sliding_window={cfg['sliding_window']} on {cls.__name__}")

    @classmethod
    def shape(cls, cfg: dict) -> LayerShape:
        bias = bool(cfg.get("attention_bias", False))
        return LayerShape(qkv_bias=bias, o_bias=bias)

    @classmethod
    def windows(cls, cfg: dict) -> tuple[int | None, ...]:
        return (None,) * cfg["num_hidden_layers"]


class Qwen2(Llama):
    @classmethod
    def check(cls, cfg: dict) -> None:
        unknown = set(cfg.get("layer_types") or ()) - {FULL, LOCAL}
        if unknown:
            raise ValueError(f"layer_types names {sorted(unknown)}")

    @classmethod
    def shape(cls, cfg: dict) -> LayerShape:
        return LayerShape(qkv_bias=True)

    @classmethod
    def windows(cls, cfg: dict) -> tuple[int | None, ...]:
        """Only where use_sliding_window is true: layer_types where written, else every
        layer from max_window_layers on."""
        n, w = cfg["num_hidden_layers"], cfg.get("sliding_window")
        if not cfg.get("use_sliding_window") or w is None:
            return (None,) * n
        types = cfg.get("layer_types") or \
            [LOCAL if i >= cfg.get("max_window_layers", 28) else FULL for i in range(n)]
        return tuple(w if t == LOCAL else None for t in types)


class Qwen3(Qwen2):
    @classmethod
    def shape(cls, cfg: dict) -> LayerShape:
        bias = bool(cfg.get("attention_bias", False))
        return LayerShape(qkv_bias=bias, o_bias=bias, qk_norm=True)


class Mistral(Llama):
    @classmethod
    def check(cls, cfg: dict) -> None:
        pass

    @classmethod
    def windows(cls, cfg: dict) -> tuple[int | None, ...]:
        return (cfg.get("sliding_window"),) * cfg["num_hidden_layers"]


class Phi3(Mistral):
    rope_types = ("longrope",)

    @classmethod
    def shape(cls, cfg: dict) -> LayerShape:
        return LayerShape()


class Gemma3(Llama):
    """One family's hooks in full: local and global layers, two RoPE bases, (1 + w) norms,
    per-head q/k norms and query_pre_attn_scalar as a factor on q."""

    @classmethod
    def check(cls, cfg: dict) -> None:
        cap = cfg.get("attn_logit_softcapping")
        if cap is not None:
            raise ValueError(f"attn_logit_softcapping={cap}: no attention path soft-caps scores")
        unknown = set(cls.layer_types(cfg)) - {FULL, LOCAL}
        if unknown:
            raise ValueError(f"layer_types names {sorted(unknown)}")

    @classmethod
    def layer_types(cls, cfg: dict) -> list[str]:
        """layer_types where written, else every sliding_window_pattern-th layer global."""
        every = cfg.get("sliding_window_pattern", 6)
        return cfg.get("layer_types") or \
            [LOCAL if (i + 1) % every else FULL for i in range(cfg["num_hidden_layers"])]

    @classmethod
    def shape(cls, cfg: dict) -> LayerShape:
        scalar = cfg.get("query_pre_attn_scalar", 256)
        return LayerShape(qk_norm=True, one_plus_w=True,
                          q_scale=(cfg.get("head_dim", 256) / scalar) ** 0.5)

    @classmethod
    def windows(cls, cfg: dict) -> tuple[int | None, ...]:
        w = cfg.get("sliding_window", 4096)
        return tuple(w if t == LOCAL else None for t in cls.layer_types(cfg))

    @classmethod
    def rope_bases(cls, cfg: dict) -> tuple[float, ...]:
        """Each layer's RoPE base, in the published spelling: rope_local_base_freq on local
        layers, rope_theta on global ones."""
        base = {LOCAL: float(cfg.get("rope_local_base_freq", 10_000.0)),
                FULL: float(cfg.get("rope_theta", 1_000_000.0))}
        return tuple(base[t] for t in cls.layer_types(cfg))


REGISTRY = {"LlamaForCausalLM": Llama, "Qwen2ForCausalLM": Qwen2, "Qwen3ForCausalLM": Qwen3,
            "MistralForCausalLM": Mistral, "Phi3ForCausalLM": Phi3,
            "Gemma3ForCausalLM": Gemma3, "Gemma3ForConditionalGeneration": Gemma3}


def family(cfg: dict) -> type:
    """The family a config.json names, after it has refused what it cannot honour."""
    if isinstance(cfg.get("text_config"), dict):  # a multimodal checkpoint: its text model
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    archs = cfg.get("architectures") or []
    fam = next((REGISTRY[a] for a in archs if a in REGISTRY), None)
    if fam is None:
        raise ValueError(f"architectures={archs}; served: {', '.join(REGISTRY)}")
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", *fam.rope_types):
        raise ValueError(f"rope_scaling.rope_type={kind!r} on {fam.__name__}")
    fam.check(cfg)
    return fam
