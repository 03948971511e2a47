"""Quantized test checkpoints: a random Hugging Face checkpoint's linears rounded to nearest and
written as compressed-tensors writes them, and the same weights dequantized into a dense twin.

Why this module exists: the engine's quantized path is held against two references it did not
compute itself: the dense model on the dequantized weights (what the quantized checkpoint
stands for) and its own reference method. Both checkpoints are written here from one rounding,
so the twin holds exactly the values the quantized one encodes.

    quant, dense = write_quantized_checkpoint(src, tmp / "q", "w4a16", 32, symmetric=True)
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanoserve.model.weights import load_hf_state_dict
from nanoserve.quantization.compressed_tensors_write import (
    layer_tensors,
    quantization_config,
    scheme,
)
from nanoserve.quantization.rtn import quantize_rtn

KEEP = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def linear_weights(hf: dict[str, torch.Tensor]) -> list[str]:
    """The decoder layers' linear weights (every 2-D ``.weight`` under ``model.layers.``)."""
    return [n for n, t in hf.items()
            if n.startswith("model.layers.") and n.endswith(".weight") and t.dim() == 2]


def write_quantized_checkpoint(src: Path, out: Path, name: str, group_size: int | None,
                               symmetric: bool = True) -> tuple[Path, Path]:
    """``src``'s decoder linears quantized by ``name`` (w8a16, w4a16, w8a8) into ``out``, the
    head left dense; and ``out``/dense, the same weights dequantized (float32). Returns both."""
    bits, act_bits, _ = scheme(name)
    hf = load_hf_state_dict(src)
    config = json.loads((src / "config.json").read_text())
    quant, dense = dict(hf), dict(hf)
    for n in linear_weights(hf):
        qw = quantize_rtn(hf[n], bits, group_size, symmetric)
        qw = replace(qw, act_bits=act_bits)
        prefix = n.removesuffix(".weight")
        del quant[n]
        quant.update(layer_tensors(prefix, qw))
        dense[n] = qw.dequantize(torch.float32)
    twin = out / "dense"
    for folder, tensors in ((out, quant), (twin, dense)):
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  folder / "model.safetensors", metadata={"format": "pt"})
        cfg = dict(config)
        if folder == out:
            cfg["quantization_config"] = quantization_config(name, group_size, symmetric,
                                                             ["lm_head"])
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        for f in KEEP:
            if (src / f).is_file():
                shutil.copy(src / f, folder / f)
    return out, twin
