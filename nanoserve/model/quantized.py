"""A quantized checkpoint's load: its weights read as published, fused, checked and installed.

Why this module exists: a checkpoint whose ``config.json`` carries a ``quantization_config``
stores each quantized linear as its format packs it; the format's reader
(``nanoserve.quantization.checkpoint``) turns those tensors into one ``QuantizedWeight`` per
layer, under the layer's ``.weight`` name, and leaves every other tensor alone. From there the
load is a dense one's with three differences, all here: q, k and v (gate and up) are fused with
``QuantizedWeight.cat``; each quantized weight is installed as its layer's method
(``layers.linear_quant``) instead of a parameter, checked against the model's shape like any
tensor; and the load says what it read (``describe``), which the loader logs and records.

    hf = read(hf, cfg)                        # no quantization_config: hf unchanged
    fused = cat_parts([q, k, v], "layers.0.self_attn.qkv_proj.weight")
"""

from __future__ import annotations

import torch
from torch import nn

from nanoserve.config import ModelConfig
from nanoserve.layers.linear import Linear
from nanoserve.layers.linear_quant import install
from nanoserve.quantization.checkpoint import read_quantized
from nanoserve.quantization.weight import QuantizedWeight


def quantization_config(cfg: ModelConfig) -> dict | None:
    return cfg.extra.get("quantization_config")


def read(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """``hf`` with each quantized layer's tensors read into ``<layer>.weight`` ->
    ``QuantizedWeight`` (``read_quantized``); unchanged for a dense checkpoint."""
    qc = quantization_config(cfg)
    return hf if qc is None else read_quantized(hf, qc)


def cat_parts(parts: list, name: str):
    """Parts of a fused weight stacked along the output features: dense tensors with
    ``torch.cat``, quantized ones with ``QuantizedWeight.cat``; a mix is refused."""
    quantized = [isinstance(p, QuantizedWeight) for p in parts]
    if not any(quantized):
        return torch.cat(parts, dim=0)
    if not all(quantized):
        raise ValueError(f"{name}: some of its parts are stored quantized and others dense; "
                         f"they cannot be fused")
    return QuantizedWeight.cat(parts, name)


def split_quantized(state: dict) -> tuple[dict, dict[str, QuantizedWeight]]:
    """(the dense tensors, the quantized weights) of nanoserve-named ``state``."""
    quantized = {k: v for k, v in state.items() if isinstance(v, QuantizedWeight)}
    return {k: v for k, v in state.items() if k not in quantized}, quantized


def release(model: nn.Module, quantized: dict[str, QuantizedWeight]) -> list[Linear]:
    """Each quantized weight's layer, its meta weight dropped so that only its bias and the
    other layers' tensors load as parameters; a quantized tensor that is not a linear's weight
    is refused by name."""
    layers = []
    for name in quantized:
        owner = model.get_submodule(name.rpartition(".")[0]) if name.endswith(".weight") \
            else None
        if not isinstance(owner, Linear):
            raise ValueError(f"{name}: stored quantized, but only a linear layer's weight can "
                             f"be (this is a {type(owner).__name__})")
        owner.weight = None
        layers.append(owner)
    return layers


def install_all(layers: list[Linear], quantized: dict[str, QuantizedWeight],
                dtype: torch.dtype, device: torch.device | str) -> None:
    """Each layer computes over its quantized weight (on ``device``) with the reference
    method, activations in ``dtype``; ``prepare_model`` may give it the kernels."""
    for layer, qw in zip(layers, quantized.values(), strict=True):
        install(layer, qw.to(device), dtype)


def describe(hf: dict, cfg: ModelConfig) -> str | None:
    """What a quantized checkpoint holds, in one line (None for a dense one): ``compressed-
    tensors w4a16, group 32, symmetric; 28 linears quantized, lm_head dense``."""
    qc = quantization_config(cfg)
    weights = [v for v in hf.values() if isinstance(v, QuantizedWeight)]
    if qc is None or not weights:
        return None
    kinds = []
    for w in weights:
        kind = (f"w{w.bits}a{w.act_bits or 16}, "
                + ("per channel" if w.groups == 1 else f"group {w.group_size}")
                + (", symmetric" if w.symmetric else ", asymmetric")
                + (", act order" if w.perm is not None else ""))
        if kind not in kinds:
            kinds.append(kind)
    head = "lm_head quantized" if isinstance(hf.get("lm_head.weight"), QuantizedWeight) \
        else "lm_head tied to the embedding" if cfg.tie_word_embeddings else "lm_head dense"
    return (f"{qc.get('quant_method')} {'; '.join(kinds)}; {len(weights)} linears quantized, "
            f"{head}")
