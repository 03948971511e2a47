"""A quantized checkpoint's tensors read into ``QuantizedWeight``s, whichever format wrote them.

Why this module exists: the loader should not know how compressed-tensors, GPTQ or AWQ pack their
numbers. A checkpoint whose ``config.json`` carries a ``quantization_config`` names its format in
``quant_method``; that format's reader (one module each, registered here) takes the checkpoint's
tensors by their Hugging Face names and gives them back with each quantized layer's stored
tensors (``weight_packed`` and ``weight_scale``; ``qweight``, ``qzeros`` and ``scales``; ...)
replaced by one ``<layer>.weight`` holding a checked ``QuantizedWeight``. Every other tensor (a
norm, a bias, a head the format left unquantized) passes through untouched, so the rest of the
load is the same for a quantized checkpoint as for a dense one.

    hf = read_quantized(hf, config["quantization_config"])
"""

from __future__ import annotations

import torch

from nanoserve.config.registries import load_class
from nanoserve.quantization.weight import QuantizedWeight

FORMATS = {  # quant_method -> "module:reader"
    "compressed-tensors": "nanoserve.quantization.compressed_tensors:read",
    "gptq": "nanoserve.quantization.gptq_format:read",
    "awq": "nanoserve.quantization.awq_format:read",
}

Tensors = dict[str, "torch.Tensor | QuantizedWeight"]


def read_quantized(hf: dict[str, torch.Tensor], quantization_config: dict) -> Tensors:
    """``hf`` with every quantized layer's tensors read into ``<layer>.weight`` ->
    ``QuantizedWeight``; a method nobody reads is a ``ValueError`` naming it and the list."""
    if not isinstance(quantization_config, dict):
        raise ValueError(f"quantization_config must be an object, got "
                         f"{type(quantization_config).__name__}")
    method = quantization_config.get("quant_method")
    if method not in FORMATS:
        raise ValueError(f"quantization_config.quant_method={method!r} is not supported; "
                         f"nanoserve reads {', '.join(FORMATS)}")
    return load_class(FORMATS[method])(hf, quantization_config)
