"""Writing a compressed-tensors checkpoint: the format vLLM, transformers and llmcompressor share.

Why this module exists: ``nanoserve quantize`` should write what the ecosystem reads, so that a
model quantized here loads in vLLM and transformers too, and a checkpoint made elsewhere loads
here through the same reader. compressed-tensors describes a checkpoint's quantization in
``config.json``'s ``quantization_config`` (schemes in ``config_groups``, each with a ``weights``
entry and, for W8A8, an ``input_activations`` one; layers left dense in ``ignore``) and stores
each quantized linear under its own name:

- ``pack-quantized`` (W4A16, W8A16): ``weight_packed`` int32 (N, ceil(K * bits / 32)),
  ``weight_scale`` (N, G) in the model's dtype, ``weight_shape`` int64 [N, K], and, asymmetric,
  ``weight_zero_point`` int32 packed along the output features (ceil(N * bits / 32), G);
- ``int-quantized`` (W8A8): ``weight`` int8 (N, K) and ``weight_scale`` (N, 1); the activations'
  scales are computed per token at run time (``dynamic``), so none are stored.

    tensors = layer_tensors("model.layers.0.mlp.down_proj", qw)
    config["quantization_config"] = quantization_config("w4a16", 32, True, ["lm_head"])
"""

from __future__ import annotations

import torch

from nanoserve.quantization.packing import pack_int32
from nanoserve.quantization.weight import QuantizedWeight

SCHEMES = {  # name -> weight bits, activation bits (None: weight-only), the format that stores it
    "w8a16": (8, None, "pack-quantized"),
    "w4a16": (4, None, "pack-quantized"),
    "w8a8": (8, 8, "int-quantized"),
}


def scheme(name: str) -> tuple[int, int | None, str]:
    if name not in SCHEMES:
        raise ValueError(f"scheme {name!r}; choose one of {tuple(SCHEMES)}")
    return SCHEMES[name]


def quantization_config(name: str, group_size: int | None, symmetric: bool,
                        ignore: list[str]) -> dict:
    """``config.json``'s ``quantization_config`` for one scheme applied to every ``Linear`` but
    those in ``ignore``. ``group_size`` None: one scale per output feature (``channel``)."""
    bits, act_bits, fmt = scheme(name)
    if act_bits is not None and (group_size is not None or not symmetric):
        raise ValueError(f"{name}: weights are symmetric, one scale per output feature")
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric,
               "group_size": group_size, "strategy": "channel" if group_size is None else "group",
               "dynamic": False, "observer": "minmax"}
    activations = None if act_bits is None else {
        "num_bits": act_bits, "type": "int", "symmetric": True, "group_size": None,
        "strategy": "token", "dynamic": True}
    return {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": activations,
                                      "output_activations": None, "format": fmt}},
        "ignore": list(ignore), "kv_cache_scheme": None, "global_compression_ratio": None,
    }


def layer_tensors(prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """One quantized linear's tensors under ``prefix`` (``model.layers.0.self_attn.q_proj``)."""
    if qw.perm is not None:
        raise ValueError(f"{prefix}: compressed-tensors stores act order as g_idx, which this "
                         f"writer does not write; quantize without act order")
    N, K = qw.shape
    if qw.act_bits is not None:  # int-quantized: one int8 per weight, one scale per row
        if qw.group_size != K or qw.zero is not None or qw.bits != 8:
            raise ValueError(f"{prefix}: W8A8 stores symmetric 8-bit weights per channel")
        return {f"{prefix}.weight": qw.q.contiguous(),
                f"{prefix}.weight_scale": qw.scale.contiguous()}
    out = {f"{prefix}.weight_packed": pack_int32(qw.q, qw.bits),
           f"{prefix}.weight_scale": qw.scale.contiguous(),
           f"{prefix}.weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if qw.zero is not None:
        out[f"{prefix}.weight_zero_point"] = pack_int32(qw.zero, qw.bits, dim=0)
    return out
