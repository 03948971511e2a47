"""Writing the quantized model as a compressed-tensors checkpoint folder.

Why this module exists: the quantized linears are held under nanoserve's fused names
(``layers.0.self_attn.qkv_proj``) and the ecosystem reads Hugging Face's (``q_proj``, ``k_proj``,
``v_proj``; ``gate_proj``, ``up_proj``). This module splits each fused ``QuantizedWeight`` back
by rows (GPTQ and RTN treat rows independently, so quantizing the fused matrix and splitting it
is the same as quantizing the parts), writes each part's tensors with
``compressed_tensors_write.layer_tensors``, and everything else dense: the embedding, the norms,
the biases and the head, in ``dtype`` (bfloat16 by default; the scales are stored in the same
dtype). ``config.json`` is the source's with a ``quantization_config``; the tokenizer files and
``generation_config.json`` are copied.

``ignore`` lists ``lm_head`` always (tied or not, the head stays dense) and every linear whose
inputs the group size does not divide: nanoserve-tiny's ``down_proj`` has 688 inputs, which
neither 32 nor 128 divides, so at those group sizes its four ``down_proj`` stay dense.

    write_checkpoint(src, out, model, quantized, recipe, skipped, dtype=torch.bfloat16)
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanoserve.config import ModelConfig
from nanoserve.model.weights import nanoserve_to_hf
from nanoserve.quantization.compressed_tensors_write import layer_tensors, quantization_config
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.quantize.recipe import Recipe

log = logging.getLogger("nanoserve")

COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "chat_template.jinja", "tokenizer.model")


def hf_parts(name: str, n_rows: int, cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """A nanoserve linear's HF modules and the rows (start, length) of each:
    ``layers.0.self_attn.qkv_proj`` -> ``model.layers.0.self_attn.q_proj``: (0, Hq*D), ...
    The split is ``nanoserve_to_hf``'s own, applied to the row numbers."""
    rows = nanoserve_to_hf({f"{name}.weight": torch.arange(n_rows)}, cfg)
    return {k.removesuffix(".weight"): (int(v[0]), len(v)) for k, v in rows.items()}


def hf_tensors(model: torch.nn.Module, cfg: ModelConfig, quantized: dict[str, QuantizedWeight],
               dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of the checkpoint by its HF name, and each quantized HF module's nanoserve
    linear. Quantized linears' weights are left out of the dense part."""
    dense = {k: v.detach().to(dtype) for k, v in model.state_dict().items()
             if k.removesuffix(".weight") not in quantized or not k.endswith(".weight")}
    out = nanoserve_to_hf(dense, cfg)
    owner = {}
    for name, qw in quantized.items():
        for prefix, (start, length) in hf_parts(name, qw.shape[0], cfg).items():
            part = qw.narrow(0, start, length).to(scale_dtype=dtype)
            out.update(layer_tensors(prefix, part))
            owner[prefix] = name
    return out, owner


def ignore_list(model: torch.nn.Module, skipped: list[str], cfg: ModelConfig) -> list[str]:
    """``lm_head`` and the HF names of the linears left dense."""
    names = ["lm_head"]
    for name in skipped:
        names.extend(hf_parts(name, model.get_submodule(name).out_features, cfg))
    return names


def write_checkpoint(src: str | Path, out: str | Path, model: torch.nn.Module,
                     quantized: dict[str, QuantizedWeight], recipe: Recipe,
                     skipped: list[str], dtype: torch.dtype = torch.bfloat16) -> Path:
    """The folder ``out``: ``config.json`` with ``quantization_config``, ``model.safetensors``,
    and the source's tokenizer and generation config. ``model`` supplies the dense tensors
    (its quantized linears' weights are not read)."""
    src, out = Path(src), Path(out)
    cfg = ModelConfig.from_dir(src)
    if dtype not in (torch.bfloat16, torch.float32, torch.float16):
        raise ValueError(f"dtype {dtype}: the dense tensors and scales are bfloat16, float16 "
                         f"or float32")
    tensors, _ = hf_tensors(model, cfg, quantized, dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    for key in ("torch_dtype", "dtype"):  # transformers 5 reads dtype, older ones torch_dtype
        if key in config or key == "torch_dtype":
            config[key] = str(dtype).removeprefix("torch.")
    config["quantization_config"] = quantization_config(
        recipe.scheme, recipe.group_size, recipe.symmetric, ignore_list(model, skipped, cfg))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out
