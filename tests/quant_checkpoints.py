"""Quantized test checkpoints: a random Hugging Face checkpoint through ``nanoserve quantize``
(round-to-nearest, float32 scales and dense tensors), and the same weights dequantized into a
dense twin.

Why this module exists: the engine's quantized path is held against two references it did not
compute itself: the dense model on the dequantized weights (what the quantized checkpoint
stands for) and its own reference method. The twin is read back from the written folder (the
compressed-tensors reader, whose own tests hold it to the library), so it holds exactly the
values the quantized checkpoint encodes.

    quant, dense = write_quantized_checkpoint(src, tmp / "q", "w4a16", 32, symmetric=True)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanoserve.model.weights import load_hf_state_dict
from nanoserve.quantization.checkpoint import read_quantized
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.quantize.command import quantize_checkpoint

KEEP = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def write_quantized_checkpoint(src: Path, out: Path, name: str, group_size: int | None,
                               symmetric: bool = True) -> tuple[Path, Path]:
    """``src`` quantized by ``name`` (w8a16, w4a16, w8a8) into ``out``, the head left dense;
    and ``out``/dense, the same weights dequantized (float32). Returns both."""
    quantize_checkpoint(src, out, name, "channel" if group_size is None else group_size,
                        symmetric=symmetric, dtype="float32")
    config = json.loads((out / "config.json").read_text())
    qc = config.pop("quantization_config")
    dense = {k: v.dequantize(torch.float32) if isinstance(v, QuantizedWeight) else v
             for k, v in read_quantized(load_hf_state_dict(out), qc).items()}
    twin = out / "dense"
    twin.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in dense.items()}, twin / "model.safetensors",
              metadata={"format": "pt"})
    (twin / "config.json").write_text(json.dumps(config, indent=2))
    for f in KEEP:
        if (out / f).is_file():
            shutil.copy(out / f, twin / f)
    return out, twin
