"""One rank's weights, read slice by slice from the checkpoint's safetensors files.

Why this module exists: a model split over ranks because it does not fit one must not be read
whole by each of them. Every tensor is opened with ``safe_open(...).get_slice(name)`` and only
this rank's rows or columns (``ShardPlan.take``) are read; then the same renaming and fusing as
one rank's load (``weights.hf_to_nanoserve``, sized by the rank's own config) and the same
shape check against the model it fills: the family's own class, as the registry names it, made
tensor-parallel (``layers.tp_class``). ``bytes_read`` says how much of the checkpoint this rank
touched.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from nanoserve.model import quantized
from nanoserve.model.registry import model_class
from nanoserve.model.weights import (
    assign_weights,
    hf_to_nanoserve,
    language_model_name,
    tensors_by_file,
)
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.tp.comm import Comm
from nanoserve.tp.layers import TensorParallel, tp_class
from nanoserve.tp.quantized import cut
from nanoserve.tp.shard import ShardPlan

SCALES = (".weight_scale", ".scales")  # a quantized layer's scales (compressed-tensors; GPTQ)


def read_slices(model_dir: str | Path, plan: ShardPlan) -> tuple[dict[str, torch.Tensor], int]:
    """This rank's piece of every tensor, by its Hugging Face name (a multimodal checkpoint's
    language model under a text model's names, its vision tower unread); and the bytes read.
    A quantized layer's tensors are read whole, then its ``QuantizedWeight`` is cut
    (``tp/quantized.py``)."""
    out, nbytes = {}, 0
    multimodal = plan.cfg.extra.get("vision_config") is not None
    files = tensors_by_file(model_dir)
    scaled = {n.rpartition(".")[0] for names in files.values() for n in names
              if n.endswith(SCALES)} if quantized.quantization_config(plan.cfg) else ()
    for f, names in files.items():
        with safe_open(f, framework="pt") as handle:
            for name in names:
                text = language_model_name(name) if multimodal else name
                if text is None or name.endswith("rotary_emb.inv_freq"):
                    continue
                layer, _, suffix = name.rpartition(".")
                whole = layer in scaled and suffix != "bias"  # its packed weight: cut after
                t = handle.get_tensor(name) if whole else plan.take(text, handle.get_slice(name))
                out[text] = t
                nbytes += t.numel() * t.element_size()
    out = quantized.read(out, plan.cfg)
    return {k: cut(plan, k, v) if isinstance(v, QuantizedWeight) else v
            for k, v in out.items()}, nbytes


def load_shard(model_dir: str | Path, plan: ShardPlan, comm: Comm, dtype: torch.dtype,
               device: torch.device | str = "cpu",
               max_model_len: int | None = None) -> TensorParallel:
    """Build rank ``plan.rank``'s model (its family's class, as the registry names it, made
    tensor-parallel by ``tp_class``) without a random init or a whole-tensor read."""
    cls = tp_class(model_class(plan.cfg))
    hf, nbytes = read_slices(model_dir, plan)
    state = hf_to_nanoserve(hf, plan.local)
    with torch.device("meta"):
        model = cls(plan, comm, max_model_len)
    assign_weights(model, state, dtype, device,
                   f"rank {plan.rank}: the checkpoint's slices do not match the shard")
    model.quantization = quantized.describe(hf, plan.cfg)
    model.bytes_read = nbytes
    return model
