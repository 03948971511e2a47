"""The text model's keys of a ``config.json``, with what the file leaves to its config class.

Why this module exists: two things stand between some published ``config.json`` files and
``ModelConfig``. A multimodal checkpoint (``Gemma3ForConditionalGeneration``) nests its language
model's keys under ``text_config``; and transformers writes a nested config *as a difference from
its class's defaults*, so Gemma 3's published ``text_config`` may name five keys and leave the
heads, head_dim, vocabulary and RoPE bases to ``Gemma3TextConfig``. A key left out means that
class's default, not Llama's: Gemma's ``head_dim`` is 256 whatever hidden / heads is, and its
global RoPE base is 1e6. The defaults below are the ones transformers' config class states, for
the keys that change the math or a shape; a family not listed keeps ``ModelConfig``'s own.

>>> d = text_model_dict({"architectures": ["Gemma3ForConditionalGeneration"],
...     "model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
...     "hidden_size": 2560, "num_hidden_layers": 34}, "vision_config": {}})
>>> d["architectures"], d["hidden_size"], d["head_dim"], d["vocab_size"], "vision_config" in d
(['Gemma3ForConditionalGeneration'], 2560, 256, 262208, True)
"""

from __future__ import annotations

# model_type -> the config class's defaults (transformers' Gemma3TextConfig)
DEFAULTS: dict[str, dict] = {
    "gemma3_text": {
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "pad_token_id": 0,
        "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
        "attention_bias": False, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "sliding_window_pattern": 6, "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "use_bidirectional_attention": False,
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    },
}
# a multimodal config's top-level keys that speak for the whole checkpoint, the text model too
OUTER = ("architectures", "torch_dtype", "dtype", "eos_token_id", "bos_token_id",
         "tie_word_embeddings", "vision_config")


def text_model_dict(d: dict) -> dict:
    """``d`` with a nested ``text_config`` lifted to the top (the keys in ``OUTER`` kept from
    the outside; ``vision_config`` stays, so the loader knows there are tensors it does not
    serve), and the defaults of the text model's config class under the keys it leaves out."""
    if isinstance(d.get("text_config"), dict):
        d = {**d["text_config"], **{k: d[k] for k in OUTER if k in d}}
    defaults = DEFAULTS.get(d.get("model_type"), {})
    if "rope_parameters" in d:  # the new spelling carries its own bases
        defaults = {k: v for k, v in defaults.items()
                    if k not in ("rope_theta", "rope_local_base_freq")}
    return {**defaults, **d}
