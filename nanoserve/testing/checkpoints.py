"""Reference checkpoints for tests and chapters, written by transformers itself.

Why this module exists: no model hub is reachable here, so correctness is checked on small random
checkpoints (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3) that transformers creates and saves with
``save_pretrained``, in the exact folder layout of a published model. nanoserve loads the folder;
transformers' own class for that family loads the same folder; the two are compared. Because
transformers wrote the files and computes the reference, the check does not rest on anything
nanoserve wrote.

Needs the ``test`` extra (transformers); the engine itself never imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Named configurations that exercise each part of the architecture the loader must get right.
CONFIGS: dict[str, dict] = {
    "gqa": dict(num_attention_heads=8, num_key_value_heads=2),
    "tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "llama3_rope": dict(
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        max_position_embeddings=256,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "head_dim": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "bias": dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                 mlp_bias=True),
}
# the vision tower of a multimodal Gemma 3 (family="gemma3-vision"): as small as it builds
TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, image_size=16, patch_size=8)

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.1,
            bos_token_id=0, eos_token_id=255, tie_word_embeddings=False)


# family -> transformers' (config class, model class) that write its checkpoints
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"),
            "phi3": ("Phi3Config", "Phi3ForCausalLM"),
            "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
            # its language model is a gemma3's, inside Gemma3Config's text_config
            "gemma3-vision": ("Gemma3TextConfig", "Gemma3ForConditionalGeneration")}

# family -> what its config class defaults to and BASE must undo (Phi3Config's pad id, 32000,
# lies past the small vocabulary)
FAMILY_BASE = {"phi3": dict(pad_token_id=None)}


def longrope_factors(pairs: int, seed: int = 0) -> dict:
    """A ``longrope`` rope_scaling with seeded factors near 1: short in [1, 1.2], long in
    [1.5, 4], one per rotated pair, so the two lists turn keys visibly differently."""
    g = torch.Generator().manual_seed(seed)
    short, long = torch.rand(pairs, generator=g), torch.rand(pairs, generator=g)
    return {"rope_type": "longrope", "short_factor": (1 + 0.2 * short).tolist(),
            "long_factor": (1.5 + 2.5 * long).tolist()}


# Variants only one family reads, by name, beside CONFIGS (which every family shares). Phi-3's
# head_dim is 16: a partial factor of 0.75 turns 12 dims (6 pairs); longrope's original length
# is 16 tokens, so a test crosses it cheaply.
VARIANTS: dict[str, dict[str, dict]] = {"phi3": {
    "phi3": dict(num_attention_heads=4, num_key_value_heads=2),
    "phi3-partial": dict(num_attention_heads=4, num_key_value_heads=2,
                         partial_rotary_factor=0.75),
    "phi3-window": dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=5),
    "phi3-longrope": dict(num_attention_heads=4, num_key_value_heads=2,
                          original_max_position_embeddings=16,
                          rope_scaling=longrope_factors(8)),
    "phi3-longrope-partial": dict(  # Phi-4-mini's kind: partial, longrope, tied
        num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.75,
        tie_word_embeddings=True, original_max_position_embeddings=16,
        rope_scaling=longrope_factors(6, seed=1)),
}, "gemma3": {
    # Gemma 3: local layers (a window of 4) between global ones, head_dim 32 where hidden /
    # heads is 16, a query_pre_attn_scalar that is not head_dim (a quarter: q is scaled by 2,
    # exactly), linear RoPE scaling on the global layers' own base, soft-capped logits
    "gemma3": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   num_hidden_layers=4, sliding_window=4, query_pre_attn_scalar=8,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                "full_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                       "rope_theta": 100_000.0},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10_000.0}},
                   final_logit_softcapping=5.0),
}}
VARIANTS["gemma3-vision"] = VARIANTS["gemma3"]  # its language model is a gemma3's


def write_hf_checkpoint(path: str | Path, name: str = "gqa", seed: int = 0,
                        max_shard_size: str | None = None, family: str = "llama",
                        **overrides) -> Path:
    """Create a random ``<Family>ForCausalLM`` with transformers and ``save_pretrained`` it;
    ``name`` is a ``CONFIGS`` shape or one of the family's ``VARIANTS``."""
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in FAMILIES[family])
    torch.manual_seed(seed)
    shape = {**CONFIGS, **VARIANTS.get(family, {})}[name]
    cfg = config_class(**{**BASE, **FAMILY_BASE.get(family, {}), **shape, **overrides})
    if family == "gemma3-vision":
        cfg = transformers.Gemma3Config(text_config=cfg, vision_config=TINY_VISION,
                                        mm_tokens_per_image=1,
                                        tie_word_embeddings=cfg.tie_word_embeddings)
    model = model_class(cfg)
    for n, p in model.named_parameters():  # HF zero-inits biases; make them matter
        if n.endswith("bias"):
            torch.nn.init.normal_(p, std=0.1)
        elif family not in ("llama", "mistral") and n.endswith("norm.weight"):
            # and ones its norms' weights (Qwen's per-head q/k norms), zeros Gemma's (a scale
            # of 1 + w)
            mean, std = (0.0, 0.2) if family.startswith("gemma") else (1.0, 0.1)
            torch.nn.init.normal_(p, mean=mean, std=std)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return Path(path)


def load_hf_model(path: str | Path):
    """transformers' own model (the class its config.json names) on the same folder, fp32,
    eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: str | Path, prompts, steps: int) -> list[tuple[list[int], list[torch.Tensor]]]:
    """transformers' own greedy decode of each prompt on the folder: per prompt, its ``steps``
    new tokens and the (V,) float32 logits each was chosen from (EOS never stops it)."""
    ref, out = load_hf_model(path), []
    ref.generation_config.eos_token_id = None
    for p in prompts:
        with torch.no_grad():
            g = ref.generate(torch.tensor([list(p)]), max_new_tokens=steps, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        out.append((g.sequences[0, len(p):].tolist(), [lg[0].float() for lg in g.logits]))
    return out


def relative_logit_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|: the error relative to the logits' own size."""
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def greedy_logits(llm, ids: list[int], steps: int) -> list[torch.Tensor]:
    """Prefill ``ids`` in row 0 of ``llm``'s engine, then ``steps`` greedy decodes: each step's
    (V,) float32 logits. Goes through the engine's own prefill and decode, so a tensor-parallel
    engine's workers run the same forwards; row 0 is released after."""
    e, out = llm.engine, []
    with torch.inference_mode():
        e.grant(0, len(ids) + steps)
        try:
            logits = e.prefill([0], [ids])
            for _ in range(steps):
                out.append(logits[0].float().clone())
                logits = e.decode([0], [int(logits[0].argmax())])
        finally:
            e.release(0)
    return out


SCHEMA_WORDS = ["name", "id", "kind", "tags", "size", "ok", "city", "note", "level", "items"]


def random_json_schema(rng, depth: int = 0) -> dict:
    """A seeded JSON schema over the keywords structured outputs must enforce: closed objects
    with required and nested fields, arrays with length bounds, enums, consts, bounded integers
    and numbers (``multipleOf``, so a complete number can end), strings with lengths or
    patterns. ``rng`` is a ``random.Random``."""
    kinds = ["integer", "number", "string", "pattern", "enum", "const", "boolean"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 1000]),
                "multipleOf": 0.25}  # unbounded decimals would let a small model ramble
    if kind == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(1, 10)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[a-z]{1,8}$", "^[0-9]{2,4}$",
                                                          "^(red|green|blue)$"])}
    if kind == "enum":
        return {"enum": rng.sample(["alpha", "beta", "gamma", 1, 2, None, True], 3)}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": random_json_schema(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.randint(1, 3)}
    keys = rng.sample(SCHEMA_WORDS, rng.randint(1, 4))
    return {"type": "object", "properties": {k: random_json_schema(rng, depth + 1) for k in keys},
            "required": rng.sample(keys, rng.randint(1, len(keys))),
            "additionalProperties": False}
