"""Day 1's numbers: the forward pass against transformers, and what the weights weigh."""

from __future__ import annotations

import torch

from chapters.common import LLAMA_3_2_1B, SHIPPED, hf_checkpoint, meta_model, tensor_bytes
from chapters.runner import bound, exact

from .snapshot.weights import load_model


def max_relative_logit_error() -> float:
    """Over the five reference configurations: GQA, tied, llama3 RoPE, head_dim, biases."""
    from nanoserve.testing import CONFIGS, load_hf_model, relative_logit_error

    worst = 0.0
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(64)[None].expand(2, 64)
    for name in CONFIGS:
        ours, ref = load_model(hf_checkpoint(name)), load_hf_model(hf_checkpoint(name))
        with torch.no_grad():
            err = relative_logit_error(ours.compute_logits(ours(ids, pos)), ref(ids).logits)
        worst = max(worst, err)
    return worst


def parameters(config: dict) -> int:
    return meta_model(config).num_parameters()


def weight_bytes(config: dict, dtype: torch.dtype) -> int:
    """Bytes of every parameter tensor of the model built in ``dtype``."""
    return tensor_bytes(*meta_model(config, dtype).parameters())


def embedding_share(config: dict) -> float:
    """Parameters in the embedding tensor over all parameters, both counted on the model."""
    model = meta_model(config)
    return model.embed_tokens.weight.numel() / model.num_parameters()


def rope_pairs(config: dict) -> str:
    """The snapshot's ``rope_inv_freq`` with and without the config's llama3 scaling, pair by
    pair: kept (unchanged), slowed (divided by exactly ``factor``), or blended (anything else)."""
    import dataclasses

    from .snapshot.config import ModelConfig
    from .snapshot.model import rope_inv_freq

    cfg = ModelConfig.from_dict(config)
    plain = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
    scaled = rope_inv_freq(cfg)
    ratio = plain / scaled
    kept = int(torch.isclose(ratio, torch.tensor(1.0)).sum())
    slowed = int(torch.isclose(ratio, torch.tensor(cfg.rope_scaling["factor"])).sum())
    return (f"{kept} kept, {slowed} slowed, {len(ratio) - kept - slowed} blended, "
            f"of {len(ratio)}")


def test_checkpoint_config(name: str) -> dict:
    """The config.json transformers wrote for that reference checkpoint."""
    import json

    return json.loads((hf_checkpoint(name) / "config.json").read_text())


def untied_head() -> str:
    """Parameters the LM head would add if it were not tied: the untied model's count minus
    the tied one's, both counted on the model."""
    extra = parameters({**LLAMA_3_2_1B, "tie_word_embeddings": False}) - parameters(LLAMA_3_2_1B)
    return f"{extra / 1e6:.1f} million"


def shipped_config() -> dict:
    import json

    return json.loads((SHIPPED / "config.json").read_text())


CLAIMS = [
    bound("max relative logit error vs transformers (5 configs, fp32)", max_relative_logit_error,
          fmt="{:.2e}".format),
    exact("nanoserve-tiny parameters", lambda: parameters(shipped_config()), fmt="{:,}".format),
    exact("nanoserve-tiny `model.safetensors` size (fp32)",
          lambda: (SHIPPED / "model.safetensors").stat().st_size / 1e6, fmt="{:.1f} MB".format),
    exact("Llama-3.2-1B shape parameters (tied embeddings)", lambda: parameters(LLAMA_3_2_1B),
          fmt="{:,}".format),
    exact("Llama-3.2-1B weights in bf16",
          lambda: weight_bytes(LLAMA_3_2_1B, torch.bfloat16) / 1e9, fmt="{:.2f} GB".format),
    exact("share of Llama-3.2-1B parameters in the embedding (ratio)",
          lambda: embedding_share(LLAMA_3_2_1B), fmt="{:.1%}".format),
    exact("Llama-3.2-1B parameters an untied LM head would add", untied_head),
    exact("llama3 RoPE frequency pairs at Llama-3.2-1B's settings",
          lambda: rope_pairs(LLAMA_3_2_1B)),
    exact("the same, the `llama3_rope` test checkpoint",
          lambda: rope_pairs(test_checkpoint_config("llama3_rope"))),
]
