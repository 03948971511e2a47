"""A dense checkpoint rewritten as a compressed-tensors one (round-to-nearest), for the benches.

Why this module exists: the quantized benchmarks and the GGUF writer's tests need W8A16, W4A16
and W8A8 checkpoints of the same weights, in the format the ecosystem writes. Until
``nanoserve quantize`` (issue 40, item 2) is the one writer, this is a small one built on the
same parts it will use: ``rtn.quantize_rtn`` for the numbers and ``compressed_tensors_write``
for the tensors and ``quantization_config``. Every ``Linear`` of the decoder layers is
quantized; the embedding, the norms and the head (tied or not, listed in ``ignore``) keep the
checkpoint's dtype. Scales are stored in the checkpoint's dtype, as llmcompressor stores them.

    write_quantized(dense_dir, out_dir, "w4a16", group_size=32)
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from nanoserve.quantization.compressed_tensors_write import (
    layer_tensors,
    quantization_config,
    scheme,
)
from nanoserve.quantization.rtn import quantize_rtn

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_linear(name: str) -> bool:
    """A decoder layer's linear weight (``model.layers.N.*.{q,k,...}_proj.weight``)."""
    return name.startswith("model.layers.") and name.endswith(".weight") and \
        name.split(".")[-2] in LINEARS


def write_quantized(src: str | Path, out: str | Path, name: str,
                    group_size: int | None = 32, symmetric: bool = True,
                    scale_dtype: torch.dtype | None = None) -> Path:
    """``src``'s weights quantized to scheme ``name`` (w8a16, w4a16, w8a8) in ``out``; made once
    (an existing ``out`` with a config.json is reused). W8A8 is per channel (no groups).
    Scales in ``scale_dtype``, default each weight's own dtype."""
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    if (out / "config.json").is_file():
        return out
    bits, act_bits, _ = scheme(name)
    if act_bits is not None:
        group_size = None
    config = json.loads((src / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    written: dict[str, torch.Tensor] = {}
    for key, w in tensors.items():
        if not is_linear(key):
            written[key] = w.contiguous()
            continue
        qw = quantize_rtn(w, bits, group_size, symmetric, scale_dtype)
        if act_bits is not None:
            qw = replace(qw, act_bits=act_bits)
        written.update(layer_tensors(key[: -len(".weight")], qw))
    config["quantization_config"] = quantization_config(name, group_size, symmetric,
                                                        ["lm_head"])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(written, tmp / "model.safetensors", metadata={"format": "pt"})
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (src / extra).is_file():
            shutil.copy(src / extra, tmp / extra)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    try:
        tmp.rename(out)
    except OSError:  # another run wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
