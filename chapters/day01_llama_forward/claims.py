"""Day 1's numbers: the forward pass against transformers, and what the weights weigh."""

from __future__ import annotations

import torch

from chapters.common import LLAMA_3_2_1B, SHIPPED, hf_checkpoint
from chapters.runner import at_most, exact

from .snapshot.config import ModelConfig
from .snapshot.model import Llama
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
    with torch.device("meta"):
        return Llama(ModelConfig.from_dict(config)).num_parameters()


def shipped_config() -> dict:
    import json

    return json.loads((SHIPPED / "config.json").read_text())


CLAIMS = [
    at_most("max relative logit error vs transformers (5 configs, fp32)", "≤ 1e-6", 1e-6,
            max_relative_logit_error),
    exact("nanoserve-tiny parameters", "3,426,560", lambda: parameters(shipped_config()),
          fmt="{:,}".format),
    exact("nanoserve-tiny model.safetensors size (fp32)", "13.7 MB",
          lambda: (SHIPPED / "model.safetensors").stat().st_size / 1e6, fmt="{:.1f} MB".format),
    exact("Llama-3.2-1B shape parameters (tied embeddings)", "1,235,814,400",
          lambda: parameters(LLAMA_3_2_1B), fmt="{:,}".format),
    exact("Llama-3.2-1B weights in bf16", "2.47 GB",
          lambda: parameters(LLAMA_3_2_1B) * 2 / 1e9, fmt="{:.2f} GB".format),
    exact("share of Llama-3.2-1B parameters in the embedding", "21.3%",
          lambda: 128256 * 2048 / parameters(LLAMA_3_2_1B), fmt="{:.1%}".format),
]
