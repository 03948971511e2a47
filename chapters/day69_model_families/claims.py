"""Day 69's numbers: what the registry serves, what each family's hooks decide, and what the
published shapes of two of them hold.

Nothing here is timed and nothing downloads. The published shapes (``nanoserve.bench.shapes``:
Qwen3-0.6B and Gemma-3-270M as their config.json files say) are built by their own family's
class on the meta device, so every tensor has its shape and none has memory; a forward on the
meta device runs the layers' code without arithmetic, which is enough to count what the norms
see. The refusals read small configs written here. Two tiny checkpoints are written by
transformers' own classes (``nanoserve.testing.write_hf_checkpoint``): a multimodal Gemma 3,
whose tensors are counted as the loader splits them, and a Phi-3 with ``longrope`` (an original
length of 16 tokens), served by the engine in float32 on the reference attention to show what
choosing its factors once per engine buys a prefix cache.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from chapters.runner import exact

from .snapshot import registry as frozen

PHI4_MINI_LIKE = {  # the keys of Phi-4-mini's config.json that these rows read
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 200064,
    "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 24, "num_key_value_heads": 8, "partial_rotary_factor": 0.75,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "sliding_window": 262144, "tie_word_embeddings": True,
}
PREFIX = [(7 * i + 3) % 250 + 1 for i in range(8)]  # the first prompt
PROMPT = PREFIX + [(11 * i + 5) % 250 + 1 for i in range(12)]  # 20 tokens, sharing PREFIX
STEPS = 6


def _cfg(d: dict):
    from nanoserve.config import ModelConfig

    return ModelConfig.from_dict(d)


def _tiny(arch: str, model_type: str, **keys) -> dict:
    return {"architectures": [arch], "model_type": model_type, "vocab_size": 64,
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, **keys}


TINY = {  # one small config per family, as the registry reads them
    "Llama": _tiny("LlamaForCausalLM", "llama"),
    "Qwen2": _tiny("Qwen2ForCausalLM", "qwen2"),
    "Qwen3": _tiny("Qwen3ForCausalLM", "qwen3"),
    "Mistral": _tiny("MistralForCausalLM", "mistral", sliding_window=8),
    "Phi3": _tiny("Phi3ForCausalLM", "phi3"),
    "Gemma3": _tiny("Gemma3ForCausalLM", "gemma3_text", head_dim=8, sliding_window=8),
}
REFUSED = [  # (config, the key=value its refusal must name)
    (_tiny("LlamaForCausalLM", "llama", rope_scaling={"rope_type": "longrope"}),
     "rope_type='longrope'"),
    (_tiny("Qwen3ForCausalLM", "qwen3", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "rope_type='yarn'"),
    (_tiny("Gemma3ForCausalLM", "gemma3_text", attn_logit_softcapping=50.0),
     "attn_logit_softcapping=50.0"),
    (_tiny("Qwen3ForCausalLM", "qwen3", use_sliding_window=True, sliding_window=8,
           layer_types=["chunked_attention", "full_attention"]), "chunked_attention"),
    (_tiny("LlamaForCausalLM", "llama", sliding_window=8), "sliding_window=8"),
]


@functools.cache
def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="nanoserve-day69-"))


@functools.cache
def meta_model(shape: str):
    """The published shape built by its family's class on the meta device."""
    import torch

    from nanoserve.bench.shapes import shape_config
    from nanoserve.model.registry import model_class

    cfg = _cfg(shape_config(shape))
    with torch.device("meta"):
        return model_class(cfg)(cfg)


def served() -> str:
    from nanoserve.config.registries import load_class
    from nanoserve.model.registry import MODEL_FAMILIES

    classes = {load_class(path) for path in MODEL_FAMILIES.values()}
    return f"{len(MODEL_FAMILIES)} architectures, {len(classes)} families"


def refusal_of_gemma1() -> str:
    """The refusal a Gemma 1 config.json gets, and how many served architectures it lists."""
    from nanoserve.model.registry import MODEL_FAMILIES, model_class

    try:
        model_class(_cfg(_tiny("GemmaForCausalLM", "gemma")))
    except ValueError as e:
        listed = sum(f"({arch})" in str(e) for arch in MODEL_FAMILIES)
        return f"{listed} of {len(MODEL_FAMILIES)} listed"
    return "served"


def parameters(shape: str) -> int:
    return meta_model(shape).num_parameters()


def gemma_parameters() -> str:
    m = meta_model("gemma-3-270m")
    n = m.num_parameters()
    return f"{n:,}; the embedding {m.embed_tokens.weight.numel() / n:.1%}"


def head_share(shape: str) -> float:
    """The LM head's share of one token's multiply-adds in linears (weights' elements)."""
    from nanoserve.layers.linear import Linear

    m = meta_model(shape)
    layers = sum(x.in_features * x.out_features for x in m.layers.modules()
                 if isinstance(x, Linear))
    head = m.lm_head.in_features * m.lm_head.out_features
    return head / (head + layers)


def gemma_layers() -> str:
    from nanoserve.model.gemma3 import FULL, LOCAL, rope_by_type

    m = meta_model("gemma-3-270m")
    bases = rope_by_type(m.cfg)
    local = sum(w is not None for w in m.windows)
    assert all((w is None) == (t == FULL) for w, t in zip(m.windows, m.types, strict=True))
    return (f"{local} of {len(m.windows)}, base {bases[LOCAL][0]:,.0f}; the other "
            f"{len(m.windows) - local} base {bases[FULL][0]:,.0f}")


def norm_work(shape: str) -> tuple[int, float]:
    """RMSNorm calls in decoder layer 0 on one token, and the values they normalise against a
    Llama layer's two norms over hidden: a forward on the meta device, counted by hooks."""
    import torch

    from nanoserve.layers.norm import GemmaRMSNorm, RMSNorm

    m, seen = meta_model(shape), []
    hooks = [x.register_forward_hook(lambda mod, args, out: seen.append(args[0].numel()))
             for x in m.layers[0].modules() if isinstance(x, RMSNorm | GemmaRMSNorm)]
    try:
        with torch.device("meta"):
            ids = torch.zeros(1, 1, dtype=torch.long)
            m(ids, ids)
    finally:
        for h in hooks:
            h.remove()
    return len(seen), sum(seen) / (2 * m.cfg.hidden_size)


def norm_row() -> str:
    return "; ".join(f"{calls} calls, {ratio:.1f}x"
                     for calls, ratio in (norm_work("qwen3-0.6b"), norm_work("gemma-3-270m")))


def phi4_like() -> str:
    from nanoserve.layers.rotary import rotary_dim
    from nanoserve.model.registry import model_class

    cfg = _cfg(PHI4_MINI_LIKE)
    family = model_class(cfg)
    windows = family.served_windows(cfg, cfg.max_position_embeddings)
    return (f"{rotary_dim(cfg)} of {cfg.head_dim}; "
            f"{sum(w is not None for w in windows)} of {len(windows)}")


def refusals() -> str:
    from nanoserve.model.registry import model_class

    named = 0
    for d, key in REFUSED:
        try:
            model_class(_cfg(d))
        except ValueError as e:
            named += key in str(e)
    return f"{named} of {len(REFUSED)}"


@functools.cache
def multimodal_counts() -> tuple[int, int, int, str]:
    """A tiny Gemma3ForConditionalGeneration checkpoint: its tensors, those the language
    model is made of, those left out, and the class that serves it."""
    from nanoserve.model.registry import model_class
    from nanoserve.model.weights import language_model_tensors, load_hf_state_dict
    from nanoserve.testing import write_hf_checkpoint

    path = write_hf_checkpoint(_tmp() / "gemma3-vision", "gemma3", family="gemma3-vision",
                               final_logit_softcapping=None)
    hf = load_hf_state_dict(path)
    text = language_model_tensors(hf)
    return len(hf), len(text), len(hf) - len(text), model_class(_cfg_dir(path)).__name__


@functools.cache
def phi3_longrope() -> Path:
    from nanoserve.testing import write_hf_checkpoint

    return write_hf_checkpoint(_tmp() / "phi3-longrope", "phi3-longrope", family="phi3")


def factors_chosen() -> str:
    from nanoserve.model.phi3 import Phi3

    cfg = _cfg_dir(phi3_longrope())
    return ", ".join("long" if Phi3.uses_long_factors(cfg, n) else "short" for n in (16, 128))


def _cfg_dir(path: Path):
    from nanoserve.config import ModelConfig

    return ModelConfig.from_dir(path)


def _llm(**kw):
    from nanoserve import LLM

    return LLM(str(phi3_longrope()), dtype="float32", skip_tokenizer_init=True, kernels=False,
               attention="reference", max_model_len=128, block_size=4, **kw)


@functools.cache
def prefix_runs() -> dict:
    """PROMPT served alone (no cache); after PREFIX with the prefix cache on; and after PREFIX
    whose keys were turned by the short factors, as a per-forward choice would turn an
    8-token forward (within the original 16), then read back by PROMPT (past it)."""
    from nanoserve import SamplingParams
    from nanoserve.layers.rotary import rope_inv_freq

    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    runs = {"alone": (_llm().generate([PROMPT], params)[0].token_ids, 0)}
    for name, short in (("static", False), ("per-forward", True)):
        llm = _llm(enable_prefix_caching=True)
        m = llm.model
        engine_freq = m.inv_freq
        if short:
            m.inv_freq = rope_inv_freq(m.cfg, long=False)
        llm.generate([PREFIX], params)
        m.inv_freq = engine_freq
        tokens = llm.generate([PROMPT], params)[0].token_ids
        runs[name] = (tokens, llm.core.snapshot().prefix_cache_hits)
    return runs


def static_row() -> str:
    r = prefix_runs()
    tokens, hits = r["static"]
    same = "the same" if tokens == r["alone"][0] else "other"
    return f"{hits} cached; {same} {len(tokens)} tokens"


def per_forward_row() -> str:
    r = prefix_runs()
    tokens, hits = r["per-forward"]
    alone = r["alone"][0]
    first = next((i for i, (a, b) in enumerate(zip(tokens, alone, strict=True)) if a != b), None)
    return f"{hits} cached; " + ("the same tokens" if first is None else
                                 f"tokens differ from token {first + 1}")


def cpp_families() -> str:
    """Families whose layers the C++ forward computes: built on the meta device from TINY,
    their ``fused_problem`` read (Phi-3 with a whole-head rotary; a partial one is not)."""
    import torch

    from nanoserve.model.registry import model_class

    names = []
    for d in TINY.values():
        cfg = _cfg(d)
        with torch.device("meta"):
            m = model_class(cfg)(cfg)
        if m.fused_problem is None:
            names.append(type(m).__name__)
    return ", ".join(names)


def tp_families() -> str:
    from nanoserve.model.registry import model_class
    from nanoserve.tp.layers import tp_class

    families = [model_class(_cfg(d)) for d in TINY.values()]
    built = [f for f in families if issubclass(tp_class(f), f)
             and tp_class(f).layer_class is f.layer_class]
    return f"{len(built)} of {len(families)}"


def snapshot_agrees() -> str:
    """The frozen registry against the package: the same class name and layer windows for
    the published shapes and the small configs of TINY."""
    from nanoserve.bench.shapes import SHAPES, shape_config
    from nanoserve.model.registry import model_class

    configs = [shape_config(s) for s in SHAPES] + list(TINY.values())
    agree = 0
    for d in configs:
        cfg = _cfg(d)
        ours = model_class(cfg)
        snap = frozen.family(d)
        agree += snap.__name__ == ours.__name__ and \
            snap.windows({**cfg.extra, **d}) == ours.layer_windows(cfg)
    return f"{agree} of {len(configs)} configs"


CLAIMS = [
    exact("architectures the registry serves, and the family classes behind them", served),
    exact("a config.json naming GemmaForCausalLM (Gemma 1): served architectures its "
          "refusal lists", refusal_of_gemma1),
    exact("parameters of the Qwen3-0.6B shape, built on the meta device",
          lambda: parameters("qwen3-0.6b"), fmt="{:,}".format),
    exact("parameters of the Gemma-3-270M shape, built on the meta device, and the "
          "embedding's share", gemma_parameters),
    exact("Gemma-3-270M shape, one decoded token: the tied LM head's share of the linears' "
          "multiply-adds", lambda: head_share("gemma-3-270m"), fmt="{:.1%}".format),
    exact("Gemma-3-270M shape: layers windowed (a 512-token window) and each kind's RoPE base",
          gemma_layers),
    exact("RMSNorm calls in one decoder layer on one token, and the values they normalise "
          "against a Llama layer's two norms over hidden: Qwen3-0.6B shape; Gemma-3-270M "
          "shape", norm_row),
    exact("Phi-4-mini-like config (head_dim 128, partial_rotary_factor 0.75, a window of "
          "262,144 over a context of 131,072): dims RoPE turns per head; layers served "
          "windowed", phi4_like),
    exact("configs a family cannot honour (the five under Inputs), refused by a ValueError "
          "naming the key and its value", refusals),
    exact("a tiny Gemma3ForConditionalGeneration checkpoint written by transformers: its "
          "tensors, those served as the language model, those left out",
          lambda: "{}, {}, {}".format(*multimodal_counts()[:3])),
    exact("the tiny Phi-3 longrope checkpoint (original length 16): factors an engine of "
          "max_model_len 16, then 128, turns every key with", factors_chosen),
    exact("a 20-token prompt after an 8-token prompt that starts it (max_model_len 128, blocks "
          "of 4): prompt tokens read from the prefix cache; greedy tokens against the prompt "
          "served alone", static_row),
    exact("the same, the cached 8 tokens turned by the short factors as a per-forward choice "
          "turns an 8-token forward", per_forward_row),
    exact("families whose decoder layers run in the C++ forward (Phi-3 with a whole-head "
          "rotary)", cpp_families),
    exact("families tensor parallelism builds as themselves (tp_class(family) a subclass of "
          "family, with its layer class)", tp_families),
    exact("the frozen snapshot's registry against the package: class and layer windows, the "
          "published shapes and one small config per family", snapshot_agrees),
]
