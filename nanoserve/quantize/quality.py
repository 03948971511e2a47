"""What quantizing cost: a model's perplexity on a token stream, and each linear's output error.

Why this module exists: quality is measured, never assumed. Two numbers say it:

- ``perplexity``: ``exp`` of the mean next-token loss over non-overlapping windows, the
  measurement ``tools/train_tiny.py`` reports as the shipped model's validation loss
  (``nanoserve.model.text_loss.evaluate``), so the quantized numbers sit beside the trained
  ones. It takes any model: until nanoserve's loader reads compressed-tensors checkpoints, the
  quantized model is the reference one (``reference_model``): the dense model with each
  quantized linear's dequantized weight in place and, for W8A8, its input rounded to int8 per
  token and back (fake quantization), numerically what a kernel must reproduce;
- ``layer_errors``: per linear, ``||X W^T - X Wq^T|| / ||X W^T||`` over the calibration inputs
  ``X`` it saw, for RTN and for GPTQ on the same inputs. With ``H = 2 X^T X / n`` that is
  ``sqrt(tr(D H D^T) / tr(W H W^T))``, ``D = W - Wq``, so no input is kept.

    ppl = perplexity(model, stream, seq_len=256)
    errors = layer_errors(model, recipe, windows)  # {name: {"rtn": e, "gptq": e}}
"""

from __future__ import annotations

import copy
import math

import torch

from nanoserve.model.text_loss import evaluate
from nanoserve.quantization.rtn import fake_quantize_per_token
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.quantize.calibrate import quantize_model
from nanoserve.quantize.recipe import Recipe


def perplexity(model: torch.nn.Module, token_ids: torch.Tensor, seq_len: int,
               stride: int | None = None) -> float:
    """``exp`` of ``model``'s mean next-token loss over the windows of ``seq_len`` tokens of
    ``token_ids`` (1-D), one every ``stride`` tokens: non-overlapping, so ``stride`` is
    ``seq_len`` (the default) or more (windows skipped between)."""
    stride = seq_len if stride is None else stride
    if stride < seq_len:
        raise ValueError(f"stride {stride} < seq_len {seq_len}: windows would overlap and "
                         f"count tokens twice")
    if stride > seq_len:  # each window with its next token, evaluated alone
        losses = [evaluate(model, token_ids[s:s + seq_len + 1], seq_len)
                  for s in range(0, len(token_ids) - seq_len, stride)]
        return math.exp(sum(losses) / len(losses))
    return math.exp(evaluate(model, token_ids, seq_len))


def relative_error(w: torch.Tensor, wq: torch.Tensor, H: torch.Tensor) -> float:
    """``||X (W - Wq)^T|| / ||X W^T||`` for inputs whose ``2 X^T X / n`` is ``H`` (K, K)."""
    w, d = w.to(torch.float64), (w - wq).to(torch.float64)
    num = torch.einsum("nk,kj,nj->", d, H, d)
    den = torch.einsum("nk,kj,nj->", w, H, w)
    return math.sqrt(max(float(num), 0.0) / float(den))


def layer_errors(model: torch.nn.Module, recipe: Recipe, calibration: torch.Tensor
                 ) -> dict[str, dict[str, float]]:
    """Per quantized linear (nanoserve names), its relative output error under RTN and under
    GPTQ, both on the inputs GPTQ's calibration pass gave it (those of the GPTQ-quantized layers
    before it). ``model`` is copied, not changed."""
    errors: dict[str, dict[str, float]] = {}
    rtn = recipe.with_method("rtn")

    def observe(name, w, H, qw):
        errors[name] = {"rtn": relative_error(w, rtn.quantize(w).dequantize(), H),
                        "gptq": relative_error(w, qw.dequantize(), H)}

    quantize_model(copy.deepcopy(model), recipe.with_method("gptq"), calibration,
                   observe=observe)
    return errors


def reference_model(model: torch.nn.Module, quantized: dict[str, QuantizedWeight],
                    dense_dtype: torch.dtype = torch.float32,
                    dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A copy of ``model`` computing in ``dtype``, its dense tensors rounded to
    ``dense_dtype`` (the checkpoint's), whose quantized linears hold their dequantized
    weights, W8A8's with inputs fake-quantized per token: the reference every quantized path
    equals."""
    ref = copy.deepcopy(model).to(dense_dtype).to(dtype)
    for name, qw in quantized.items():
        lin = ref.get_submodule(name)
        lin.weight.data.copy_(qw.dequantize(dtype))
        if qw.act_bits is not None:
            lin.register_forward_pre_hook(lambda m, args: (fake_quantize_per_token(args[0]),))
    return ref
